// Parley's browser demo: log in over WebSocket with a device id and token,
// list the conversations, show the selected one, its pushes live, and send.
// Each binary WebSocket message is one msgpack map (docs/protocol.md,
// "WebSocket"); msgpack comes from the vendored @msgpack/msgpack build.

const { encode, decode } = globalThis.MessagePack;
const $ = (id) => document.getElementById(id);

const params = new URLSearchParams(location.search);
$("server").value = params.get("ws") || `ws://${location.hostname || "127.0.0.1"}:7071/v1/ws`;
$("device").value = params.get("device") || "";

let ws = null;
let me = null; // auth_ok
let nextRid = 1;
const pending = new Map(); // rid -> {resolve, reject}
const convs = new Map(); // conv -> item of convs_ok (head kept current)
const events = new Map(); // conv -> Map(seq -> event)
let selected = null;
let pinger = null;

function log(line) {
  const div = document.createElement("div");
  div.textContent = `${new Date().toISOString().slice(11, 23)} ${line}`;
  $("log").prepend(div);
}

function status(text) {
  $("status").textContent = text;
}

// request sends a frame with a fresh rid and resolves with its reply (an
// error frame rejects).
function request(frame) {
  const rid = String(nextRid++);
  frame.rid = rid;
  return new Promise((resolve, reject) => {
    pending.set(rid, { resolve, reject });
    ws.send(encode(frame));
  });
}

function text(body) {
  return body instanceof Uint8Array ? new TextDecoder().decode(body) : String(body ?? "");
}

function connect() {
  if (ws) ws.close();
  const device = $("device").value.trim();
  const token = $("token").value;
  status("connecting…");
  ws = new WebSocket($("server").value, "parley.msgpack");
  ws.binaryType = "arraybuffer";
  ws.onopen = async () => {
    try {
      me = await request({ t: "auth", device, token });
      status(`${me.user} / ${me.device}`);
      log(`auth_ok user=${me.user} device=${me.device}`);
      $("text").disabled = $("send").disabled = false;
      clearInterval(pinger);
      pinger = setInterval(() => request({ t: "ping" }).catch(() => {}), 30000);
      await loadConvs();
    } catch (e) {
      status(`auth failed: ${e.message}`);
    }
  };
  ws.onmessage = (msg) => {
    if (typeof msg.data === "string") return; // the server sends binary only
    const f = decode(new Uint8Array(msg.data));
    if (f.rid && pending.has(f.rid)) {
      const p = pending.get(f.rid);
      pending.delete(f.rid);
      if (f.t === "error") p.reject(new Error(`${f.code}: ${f.msg}`));
      else p.resolve(f);
      return;
    }
    onServerFrame(f);
  };
  ws.onclose = (ev) => {
    clearInterval(pinger);
    status(`disconnected (${ev.code})`);
    log(`closed ${ev.code} ${ev.reason}`);
    $("text").disabled = $("send").disabled = true;
    for (const p of pending.values()) p.reject(new Error("connection closed"));
    pending.clear();
  };
}

function onServerFrame(f) {
  switch (f.t) {
    case "push":
      log(`push ${f.conv}#${f.seq} from ${f.sender}`);
      addEvents(f.conv, [f]);
      if (!convs.has(f.conv)) loadConvs();
      else bump(f.conv, f.seq, f.sender !== me.user && f.kind === "msg");
      break;
    case "hint":
      log(`hint ${f.conv} head ${f.head}`);
      syncConv(f.conv);
      break;
    case "read_changed":
      if (convs.has(f.conv)) { convs.get(f.conv).unread = f.unread; renderConvs(); }
      break;
    case "kick":
      log(`kicked: ${f.reason}`);
      status(`kicked (${f.reason})`);
      break;
    case "error":
      log(`error ${f.code}: ${f.msg}`);
      break;
  }
}

async function loadConvs() {
  const r = await request({ t: "convs", limit: 100 });
  convs.clear();
  for (const item of r.items || []) convs.set(item.conv, item);
  renderConvs();
  if (!selected && r.items && r.items.length) select(r.items[0].conv);
}

function bump(conv, seq, unread) {
  const c = convs.get(conv);
  c.head = Math.max(Number(c.head), Number(seq));
  if (unread && conv !== selected) c.unread = Number(c.unread || 0) + 1;
  renderConvs();
}

function renderConvs() {
  const ul = $("convs");
  ul.replaceChildren();
  for (const c of convs.values()) {
    const li = document.createElement("li");
    li.dataset.conv = c.conv;
    li.textContent = c.title || c.conv;
    if (Number(c.unread) > 0) {
      const u = document.createElement("span");
      u.className = "unread";
      u.textContent = c.unread;
      li.append(u);
    }
    if (c.conv === selected) li.className = "selected";
    li.onclick = () => select(c.conv);
    ul.append(li);
  }
}

async function select(conv) {
  selected = conv;
  renderConvs();
  await syncConv(conv);
  markRead(conv);
}

// syncConv reads the conversation's events it does not hold yet, page by
// page (the next page starts at upto).
async function syncConv(conv) {
  const have = events.get(conv);
  let after = have && have.size ? Math.max(...have.keys()) : 0;
  for (let i = 0; i < 20; i++) {
    const r = await request({ t: "sync", conv, after, limit: 200 });
    addEvents(conv, r.events || []);
    after = Number(r.upto);
    if (!r.more) break;
  }
}

function markRead(conv) {
  const c = convs.get(conv);
  if (!c || !Number(c.head)) return;
  request({ t: "read", conv, seq: c.head }).catch((e) => log(`read: ${e.message}`));
  c.unread = 0;
  renderConvs();
}

function addEvents(conv, list) {
  if (!events.has(conv)) events.set(conv, new Map());
  const m = events.get(conv);
  for (const e of list) m.set(Number(e.seq), e);
  if (conv === selected) renderEvents();
}

function renderEvents() {
  const main = $("events");
  main.replaceChildren();
  const m = events.get(selected) || new Map();
  for (const seq of [...m.keys()].sort((a, b) => a - b)) {
    const e = m.get(seq);
    const div = document.createElement("div");
    div.className = "event";
    div.dataset.seq = seq;
    if (e.kind === "msg") {
      if (me && e.sender === me.user) div.classList.add("mine");
      const who = document.createElement("span");
      who.className = "who";
      who.textContent = `${e.sender}: `;
      const body = document.createElement("span");
      body.className = "body";
      body.textContent = e.recalled ? "(recalled)" : text(e.body);
      div.append(who, body);
    } else {
      div.classList.add("system");
      div.textContent = `${e.kind} ${e.sender || ""} ${(e.users || []).join(", ")}`;
    }
    main.append(div);
  }
  main.scrollTop = main.scrollHeight;
}

async function send() {
  const body = $("text").value;
  if (!body || !selected) return;
  $("text").value = "";
  const cmid = `web-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
  try {
    const ok = await request({ t: "send", conv: selected, cmid, body: new TextEncoder().encode(body) });
    addEvents(selected, [{ seq: ok.seq, kind: "msg", sender: me.user, body, ts: ok.ts, cmid }]);
    bump(selected, ok.seq, false);
  } catch (e) {
    log(`send failed: ${e.message}`);
  }
}

$("connect").onclick = connect;
$("send").onclick = send;
$("text").onkeydown = (e) => { if (e.key === "Enter") send(); };
