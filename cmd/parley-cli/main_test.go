package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/test/parleytest"
)

// cli runs the CLI in-process with stdin and returns its exit status and
// output.
func cli(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errb lockedBuffer
	code = run(ctx, args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// decode parses out as exactly one JSON object.
func decode[T any](t *testing.T, what, out string) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%s: output %q is not the expected JSON: %v", what, out, err)
	}
	if dec.More() {
		t.Fatalf("%s: more than one JSON value in %q", what, out)
	}
	return v
}

type event struct {
	Conv     string   `json:"conv"`
	T        string   `json:"t"`
	Seq      int64    `json:"seq"`
	Kind     string   `json:"kind"`
	Sender   string   `json:"sender"`
	Body     *string  `json:"body"`
	Ts       int64    `json:"ts"`
	Cmid     string   `json:"cmid"`
	Recalled bool     `json:"recalled"`
	Target   int64    `json:"target"`
	Users    []string `json:"users"`
	// update events
	Role       string  `json:"role"`
	MutedUntil *int64  `json:"muted_until"`
	Banned     *bool   `json:"banned"`
	Title      *string `json:"title"`
	Invite     string  `json:"invite"`
}

type errorOut struct {
	Error string `json:"error"`
	Msg   string `json:"msg"`
}

// Admin helpers provision users, devices and a group; then -json send,
// convs, open and read print one JSON object each with the protocol's
// fields; errors give {"error": CODE} and the documented exit statuses;
// watch prints pushes as JSON lines; an interactive session runs a script.
func TestCLI(t *testing.T) {
	env := parleytest.Start(t, parleytest.Config(t))
	admin := func(args ...string) (int, string, string) {
		t.Helper()
		return cli(t, "", append([]string{"admin", "-admin", env.AdminURL, "-token", parleytest.AdminToken}, args...)...)
	}
	for _, u := range []string{"ana", "ben"} {
		if code, out, errOut := admin("user", u); code != 0 || out != "created user "+u+"\n" {
			t.Fatalf("admin user %s: %d %q %q", u, code, out, errOut)
		}
	}
	code, out, errOut := admin("device", "ana-cli", "ana")
	anaTok := strings.TrimSpace(out)
	if code != 0 || anaTok == "" || strings.Contains(anaTok, " ") || !strings.Contains(errOut, "-device ana-cli -token "+anaTok) {
		t.Fatalf("admin device: %d %q %q; want the token alone on stdout", code, out, errOut)
	}
	code, out, _ = admin("-json", "device", "ben-cli", "ben")
	dev := decode[struct {
		ID, User, Token string
		InstallEpoch    int64 `json:"install_epoch"`
	}](t, "admin -json device", out)
	if code != 0 || dev.ID != "ben-cli" || dev.User != "ben" || dev.Token == "" {
		t.Fatalf("admin -json device: %d %+v", code, dev)
	}
	benTok := dev.Token
	if code, out, errOut := admin("group", "g1", "ana", "ben"); code != 0 || out != "created group g1 (head 1)\n" {
		t.Fatalf("admin group: %d %q %q", code, out, errOut)
	}
	if code, out, _ := admin("-json", "user", "ana"); code != 1 || decode[errorOut](t, "admin user again", out).Error != "EXISTS" {
		t.Fatalf("admin user ana again: %d %q; want 1, EXISTS", code, out)
	}
	if code, _, _ := cli(t, "", "admin", "-admin", env.AdminURL, "-token", "wrong", "user", "cy"); code != 1 {
		t.Fatalf("admin with a wrong token: exit %d, want 1", code)
	}

	as := func(dev, tok string, args ...string) (int, string, string) {
		t.Helper()
		return cli(t, "", append([]string{"-addr", env.Addr, "-device", dev, "-token", tok, "-timeout", "5s"}, args...)...)
	}

	// send: the reply's fields; the text is the rest of the line.
	code, out, errOut = as("ana-cli", anaTok, "-json", "send", "g1", "hello", "world")
	sent := decode[struct {
		Conv, Cmid string
		Seq, Ts    int64
		Dup        bool
	}](t, "send", out)
	if code != 0 || sent.Conv != "g1" || sent.Seq != 2 || sent.Ts == 0 || !strings.HasPrefix(sent.Cmid, "cli-") || sent.Dup {
		t.Fatalf("send: %d %+v (%s)", code, sent, errOut)
	}

	// convs, seen by ben: one unread message.
	code, out, errOut = as("ben-cli", benTok, "-json", "convs")
	type conv struct {
		Conv, Kind, Mode                              string
		Epoch, Head, Delivered, Read, Cleared, Unread int64
		MinSeq                                        int64 `json:"min_seq"`
		LastTs                                        int64 `json:"last_ts"`
	}
	convs := decode[struct{ Items []conv }](t, "convs", out)
	if code != 0 || len(convs.Items) != 1 {
		t.Fatalf("convs: %d %q %q", code, out, errOut)
	}
	if it := convs.Items[0]; it.Conv != "g1" || it.Kind != "group" || it.Mode != "push" || it.Epoch != 1 ||
		it.Head != 2 || it.MinSeq != 1 || it.Read != 0 || it.Unread != 1 || it.LastTs != sent.Ts {
		t.Fatalf("convs item: %+v", it)
	}

	// open, by ben: the join and the message.
	code, out, errOut = as("ben-cli", benTok, "-json", "open", "g1")
	opened := decode[struct {
		Conv                            string
		Epoch, Head, Upto, Read, Unread int64
		MinSeq                          int64 `json:"min_seq"`
		Events                          []event
	}](t, "open", out)
	if code != 0 || opened.Conv != "g1" || opened.Head != 2 || opened.Upto != 2 || opened.Epoch != 1 || opened.MinSeq != 1 ||
		opened.Read != 0 || opened.Unread != 1 || len(opened.Events) != 2 {
		t.Fatalf("open: %d %q %q", code, out, errOut)
	}
	if j := opened.Events[0]; j.Seq != 1 || j.Kind != "join" || strings.Join(j.Users, ",") != "ana,ben" || j.Body != nil {
		t.Fatalf("open: first event %+v, want the join of ana and ben", j)
	}
	if m := opened.Events[1]; m.Seq != 2 || m.Kind != "msg" || m.Sender != "ana" || m.Body == nil || *m.Body != "hello world" || m.Cmid != sent.Cmid {
		t.Fatalf("open: second event %+v, want ana's message", m)
	}

	// read, by ben, up to the head by default.
	code, out, _ = as("ben-cli", benTok, "-json", "read", "g1")
	if rd := decode[struct {
		Conv         string
		Read, Unread int64
	}](t, "read", out); code != 0 || rd.Conv != "g1" || rd.Read != 2 || rd.Unread != 0 {
		t.Fatalf("read: %d %+v", code, rd)
	}

	// Errors.
	code, out, _ = as("ben-cli", benTok, "-json", "send", "nope", "x")
	if e := decode[errorOut](t, "send to nope", out); code != 1 || e.Error != "NOT_MEMBER" {
		t.Fatalf("send to a conversation ben is not in: %d %+v, want 1, NOT_MEMBER", code, e)
	}
	code, out, _ = as("ben-cli", benTok, "-json", "frobnicate")
	if e := decode[errorOut](t, "unknown command", out); code != 2 || e.Error != "USAGE" {
		t.Fatalf("unknown command: %d %+v, want 2, USAGE", code, e)
	}
	code, out, _ = as("ben-cli", benTok, "-json", "recall", "g1")
	if e := decode[errorOut](t, "recall without seq", out); code != 2 || e.Error != "USAGE" || !strings.Contains(e.Msg, "recall [CONV] SEQ") {
		t.Fatalf("recall without a seq: %d %+v, want 2 and the usage", code, e)
	}
	code, out, _ = as("ben-cli", "wrong-token", "-json", "ping")
	if e := decode[errorOut](t, "bad token", out); code != 1 || e.Error != "AUTH_FAILED" {
		t.Fatalf("bad token: %d %+v, want 1, AUTH_FAILED", code, e)
	}
	if code, _, _ := cli(t, "", "-json", "convs"); code != 2 {
		t.Fatalf("no -device: exit %d, want 2", code)
	}

	// watch: ben prints pushes as JSON lines while ana sends.
	type watched struct {
		code     int
		out, err string
	}
	done := make(chan watched, 1)
	go func() {
		code, out, errOut := as("ben-cli", benTok, "-json", "-wait", "1500ms", "watch")
		done <- watched{code, out, errOut}
	}()
	var w watched
	ticks := 0
sending:
	for {
		select {
		case w = <-done:
			break sending
		case <-time.After(150 * time.Millisecond):
		}
		if ticks < 5 {
			ticks++
			if code, out, errOut := as("ana-cli", anaTok, "send", "g1", fmt.Sprintf("tick %d", ticks)); code != 0 {
				t.Fatalf("send tick: %d %q %q", code, out, errOut)
			}
		}
	}
	if w.code != 0 {
		t.Fatalf("watch: exit %d %q %q", w.code, w.out, w.err)
	}
	var pushes []event
	for _, line := range strings.Split(strings.TrimSpace(w.out), "\n") {
		if line == "" {
			continue
		}
		var ev event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("watch: line %q is not JSON: %v", line, err)
		}
		if ev.T == "push" {
			pushes = append(pushes, ev)
		}
	}
	if len(pushes) == 0 {
		t.Fatalf("watch printed no push: %q", w.out)
	}
	for i, p := range pushes {
		if p.Conv != "g1" || p.Kind != "msg" || p.Sender != "ana" || p.Body == nil || !strings.HasPrefix(*p.Body, "tick ") ||
			(i > 0 && p.Seq != pushes[i-1].Seq+1) {
			t.Fatalf("watch: push %d = %+v (all: %q)", i, p, w.out)
		}
	}

	// An interactive session, scripted.
	script := "convs\nopen g1\nsend hi there\nread\nrecall 2\nedit 2 too late\ntyping\nreceipts\nprivate on\nclear\nsnapshot g1:1 nope\nping\nbogus\nquit\n"
	code, out, errOut = cli(t, script, "-addr", env.Addr, "-device", "ana-cli", "-token", anaTok)
	if code != 0 {
		t.Fatalf("interactive: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{
		"connected to " + env.Addr + " as ana (device ana-cli): 1 conversations, 0 unread messages",
		"CONV", "LAST ACTIVITY", // convs
		"ana: hello world",                    // open
		"sent: g1 #",                          // send
		"g1: read ",                           // read
		"g1: recalled #2",                     // recall
		"NOT_FOUND",                           // edit of a recalled message
		"g1: typing sent",                     // typing
		"g1: read positions",                  // receipts
		"read receipts: private",              // private on
		"g1: cleared up to",                   // clear
		"-- g1: head ", "-- nope: NOT_MEMBER", // snapshot
		"pong in", "unknown command \"bogus\"",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("interactive output lacks %q:\n%s\nstderr:\n%s", want, out, errOut)
		}
	}
}

// TestCLILifecycle: show-user, rotate, revoke, suspend and unsuspend.
func TestCLILifecycle(t *testing.T) {
	env := parleytest.Start(t, parleytest.Config(t))
	admin := func(args ...string) (int, string, string) {
		t.Helper()
		return cli(t, "", append([]string{"admin", "-admin", env.AdminURL, "-token", parleytest.AdminToken}, args...)...)
	}
	admin("user", "lu")
	admin("device", "lu-1", "lu")
	code, out, _ := admin("device", "lu-2", "lu")
	tok2 := strings.TrimSpace(out)
	if code, out, errOut := admin("show-user", "lu"); code != 0 || !strings.HasPrefix(out, "lu: suspended false, 2 devices\n") || !strings.Contains(out, "  lu-1  connected false  install_epoch 0\n") {
		t.Fatalf("show-user: %d %q %q", code, out, errOut)
	}
	code, out, errOut := admin("rotate", "lu-2")
	newTok := strings.TrimSpace(out)
	if code != 0 || newTok == "" || newTok == tok2 || strings.Contains(newTok, " ") || !strings.Contains(errOut, "shown once") {
		t.Fatalf("rotate: %d %q %q", code, out, errOut)
	}
	if code, out, _ := admin("revoke", "lu-1"); code != 0 || out != "revoked device lu-1\n" {
		t.Fatalf("revoke: %d %q", code, out)
	}
	if code, out, _ := admin("suspend", "lu"); code != 0 || out != "user lu: suspended true\n" {
		t.Fatalf("suspend: %d %q", code, out)
	}
	if code, out, _ := admin("-json", "show-user", "lu"); code != 0 || !strings.Contains(out, `"suspended":true`) || strings.Contains(out, "lu-1") {
		t.Fatalf("show-user -json: %d %q", code, out)
	}
	if code, out, _ := admin("unsuspend", "lu"); code != 0 || out != "user lu: suspended false\n" {
		t.Fatalf("unsuspend: %d %q", code, out)
	}
	if code, out, _ := admin("-json", "revoke", "nope"); code != 1 || decode[errorOut](t, "revoke nope", out).Error != "NOT_FOUND" {
		t.Fatalf("revoke nope: %d %q", code, out)
	}
}

// TestCLINotify: notify register / unregister and mute, in JSON mode.
func TestCLINotify(t *testing.T) {
	cfg := parleytest.Config(t)
	cfg.NotifyWebhookURL, cfg.NotifyWebhookSecret = "http://127.0.0.1:9/hook", "s"
	env := parleytest.Start(t, cfg)
	ben := env.User(t, "ben", 1)[0]
	env.User(t, "ana", 0)
	env.Group(t, "g1", "ana", "ben")
	as := func(args ...string) (int, string) {
		t.Helper()
		code, out, _ := cli(t, "", append([]string{"-addr", env.Addr, "-device", ben.ID, "-token", ben.Token, "-json"}, args...)...)
		return code, out
	}
	code, out := as("notify", "register", "webhook", "tok-1")
	if r := decode[struct {
		Provider   string
		Registered bool
	}](t, "notify register", out); code != 0 || r.Provider != "webhook" || !r.Registered {
		t.Fatalf("notify register: %d %q", code, out)
	}
	var dev struct {
		Notify *struct{ Provider string } `json:"notify"`
	}
	if env.Admin(t, "GET", "/v1/devices/"+ben.ID, nil, &dev); dev.Notify == nil || dev.Notify.Provider != "webhook" {
		t.Fatalf("device after register: %+v", dev)
	}
	if code, out := as("notify", "register", "apns", "tok"); code != 1 || decode[errorOut](t, "apns", out).Error != "BAD_REQUEST" {
		t.Fatalf("register a provider without credentials: %d %q", code, out)
	}
	if code, out := as("notify", "unregister"); code != 0 || !strings.Contains(out, `"registered":false`) {
		t.Fatalf("notify unregister: %d %q", code, out)
	}
	if env.Admin(t, "GET", "/v1/devices/"+ben.ID, nil, &dev); dev.Notify != nil {
		t.Fatalf("device after unregister: %+v", dev)
	}
	before := time.Now().Add(8 * time.Hour).UnixMilli()
	code, out = as("mute", "g1", "8h")
	m := decode[struct {
		Conv       string
		MutedUntil int64 `json:"muted_until"`
	}](t, "mute", out)
	if code != 0 || m.Conv != "g1" || m.MutedUntil < before || m.MutedUntil > before+60_000 {
		t.Fatalf("mute: %d %q", code, out)
	}
	if code, out := as("mute", "g1", "soon"); code != 2 || decode[errorOut](t, "mute soon", out).Error != "USAGE" {
		t.Fatalf("mute with a bad duration: %d %q", code, out)
	}
	if code, out := as("mute", "nope", "1h"); code != 1 || decode[errorOut](t, "mute nope", out).Error != "NOT_MEMBER" {
		t.Fatalf("mute a conversation ben is not in: %d %q", code, out)
	}
	if code, out := as("mute", "g1", "0"); code != 0 || !strings.Contains(out, `"muted_until":0`) {
		t.Fatalf("unmute: %d %q", code, out)
	}
}

// TestCLIModeration: ana creates a group (she owns it) and moderates it
// with role, mute-member, conv-update, remove, ban and unban, in JSON and
// text; refusals exit 1 with FORBIDDEN (ben, an admin, giving a role; cy,
// a plain member, removing; cy's send while muted), bad arguments exit 2;
// open shows the update events.
func TestCLIModeration(t *testing.T) {
	env := parleytest.Start(t, parleytest.Config(t))
	devs := map[string]parleytest.Device{}
	for _, u := range []string{"ana", "ben", "cy"} {
		devs[u] = env.User(t, u, 1)[0]
	}
	as := func(user string, args ...string) (int, string) {
		t.Helper()
		d := devs[user]
		code, out, _ := cli(t, "", append([]string{"-addr", env.Addr, "-device", d.ID, "-token", d.Token, "-timeout", "5s"}, args...)...)
		return code, out
	}
	type update struct {
		Conv, User, Role, Invite string
		Seq                      int64
		MutedUntil               *int64 `json:"muted_until"`
		Banned                   *bool
		Title                    *string
	}
	refusal := func(what, want string, code int, out string) {
		t.Helper()
		if e := decode[errorOut](t, what, out); code != 1 || e.Error != want {
			t.Fatalf("%s: exit %d %+v, want 1, %s", what, code, e, want)
		}
	}
	usage := func(what string, code int, out string) {
		t.Helper()
		if e := decode[errorOut](t, what, out); code != 2 || e.Error != "USAGE" {
			t.Fatalf("%s: exit %d %+v, want 2, USAGE", what, code, e)
		}
	}

	if code, out := as("ana", "create", "group", "g1", "ben", "cy"); code != 0 || out != "opened g1 (head 1)\n" {
		t.Fatalf("create: %d %q", code, out)
	}
	code, out := as("ana", "-json", "role", "g1", "ben", "admin")
	if u := decode[update](t, "role", out); code != 0 || u.Conv != "g1" || u.Seq != 2 || u.User != "ben" || u.Role != "admin" {
		t.Fatalf("role: %d %q", code, out)
	}
	code, out = as("ana", "-json", "role", "g1", "ben", "boss")
	usage("role boss", code, out)
	code, out = as("ben", "-json", "role", "g1", "cy", "admin")
	refusal("role by an admin", "FORBIDDEN", code, out)

	before := time.Now().Add(10 * time.Minute).UnixMilli()
	code, out = as("ben", "-json", "mute-member", "g1", "cy", "10m")
	if u := decode[update](t, "mute-member", out); code != 0 || u.Seq != 3 || u.User != "cy" || u.MutedUntil == nil ||
		*u.MutedUntil < before || *u.MutedUntil > before+60_000 {
		t.Fatalf("mute-member: %d %q", code, out)
	}
	code, out = as("cy", "-json", "send", "g1", "hello?")
	refusal("send while muted", "FORBIDDEN", code, out)
	code, out = as("ben", "-json", "mute-member", "g1", "cy", "soon")
	usage("mute-member soon", code, out)
	code, out = as("cy", "-json", "remove", "g1", "ben")
	refusal("remove by a plain member", "FORBIDDEN", code, out)

	code, out = as("ana", "-json", "conv-update", "g1", "-title", "Road", "trip", "-invite", "admins")
	if u := decode[update](t, "conv-update", out); code != 0 || u.Seq != 4 || u.Title == nil || *u.Title != "Road trip" || u.Invite != "admins" {
		t.Fatalf("conv-update: %d %q", code, out)
	}
	for _, bad := range [][]string{{"g1"}, {"g1", "-invite", "everyone"}, {"g1", "-invite"}, {"g1", "title"}} {
		code, out = as("ana", append([]string{"-json", "conv-update"}, bad...)...)
		usage(fmt.Sprintf("conv-update %q", bad), code, out)
	}

	code, out = as("ben", "-json", "remove", "g1", "cy")
	if r := decode[struct {
		Conv  string
		Users []string
		Head  int64
	}](t, "remove", out); code != 0 || r.Conv != "g1" || strings.Join(r.Users, ",") != "cy" || r.Head != 5 {
		t.Fatalf("remove: %d %q", code, out)
	}
	code, out = as("ana", "-json", "ban", "g1", "cy")
	if u := decode[update](t, "ban", out); code != 0 || u.Seq != 6 || u.User != "cy" || u.Banned == nil || !*u.Banned {
		t.Fatalf("ban: %d %q", code, out)
	}
	code, out = as("ana", "-json", "add", "g1", "cy")
	refusal("add a banned user", "FORBIDDEN", code, out)
	if code, out := as("ana", "unban", "g1", "cy"); code != 0 || out != "g1: cy unbanned (seq 7)\n" {
		t.Fatalf("unban: %d %q", code, out)
	}
	if code, out := as("ana", "role", "g1", "ben", "member"); code != 0 || out != "g1: ben is member (seq 8)\n" {
		t.Fatalf("role in text: %d %q", code, out)
	}

	// The events, as open shows them.
	code, out = as("ana", "-json", "open", "g1")
	opened := decode[struct {
		Conv                            string
		Epoch, Head, Upto, Read, Unread int64
		MinSeq                          int64 `json:"min_seq"`
		Events                          []event
	}](t, "open", out)
	if code != 0 || opened.Head != 8 || len(opened.Events) != 8 {
		t.Fatalf("open: %d %q", code, out)
	}
	evs := opened.Events
	if e := evs[1]; e.Kind != "update" || e.Sender != "ana" || strings.Join(e.Users, ",") != "ben" || e.Role != "admin" {
		t.Fatalf("open: seq 2 = %+v, want ana's update making ben admin", e)
	}
	if e := evs[2]; e.Kind != "update" || e.Sender != "ben" || e.MutedUntil == nil || *e.MutedUntil < before {
		t.Fatalf("open: seq 3 = %+v, want ben's mute of cy", e)
	}
	if e := evs[3]; e.Kind != "update" || e.Title == nil || *e.Title != "Road trip" || e.Invite != "admins" || len(e.Users) != 0 {
		t.Fatalf("open: seq 4 = %+v, want the title and invite update", e)
	}
	if e := evs[4]; e.Kind != "leave" || e.Sender != "ben" || strings.Join(e.Users, ",") != "cy" {
		t.Fatalf("open: seq 5 = %+v, want ben's removal of cy", e)
	}
	if e := evs[5]; e.Kind != "update" || e.Banned == nil || !*e.Banned || evs[6].Banned == nil || *evs[6].Banned {
		t.Fatalf("open: seqs 6, 7 = %+v, %+v, want the ban and the unban", e, evs[6])
	}
	// A group made through the admin API has no owner until one is set.
	admin := func(args ...string) (int, string, string) {
		t.Helper()
		return cli(t, "", append([]string{"admin", "-admin", env.AdminURL, "-token", parleytest.AdminToken}, args...)...)
	}
	if code, out, errOut := admin("group", "g2", "ana", "ben"); code != 0 {
		t.Fatalf("admin group: %d %q %q", code, out, errOut)
	}
	code, out = as("ana", "-json", "role", "g2", "ben", "admin")
	refusal("role in a group without owner", "FORBIDDEN", code, out)
	if code, out, errOut := admin("role", "g2", "ana", "owner"); code != 0 || out != "g2: ana is owner (seq 2)\n" {
		t.Fatalf("admin role: %d %q %q", code, out, errOut)
	}
	if code, out, _ := admin("-json", "role", "g2", "ana", "boss"); code != 1 || !strings.Contains(out, "BAD_REQUEST") {
		t.Fatalf("admin role boss: %d %q, want 1, BAD_REQUEST", code, out)
	}
	if code, out := as("ana", "-json", "role", "g2", "ben", "admin"); code != 0 || decode[update](t, "role in g2", out).Seq != 3 {
		t.Fatalf("role by the new owner: %d %q", code, out)
	}
	if code, out, errOut := admin("members", "g2"); code != 0 || !strings.HasPrefix(out, "g2: 2 members\n") ||
		!strings.Contains(out, "  ana  owner  from #1\n") || !strings.Contains(out, "  ben  admin  from #1\n") {
		t.Fatalf("admin members: %d %q %q", code, out, errOut)
	}

	code, out = as("ana", "open", "g1")
	for _, want := range []string{
		"* ana made ben admin", "* ben muted cy until ", `* ana set the title to "Road trip", set invite to admins`,
		"* left: cy (removed by ben)", "* ana banned cy", "* ana unbanned cy", "* ana made ben member",
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("open in text lacks %q: %d\n%s", want, code, out)
		}
	}
}
