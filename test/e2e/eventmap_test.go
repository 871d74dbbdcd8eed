package e2e_test

import (
	"bytes"
	"fmt"
	"maps"
	"net"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/wire"
)

// rawDev is a device on a plain TCP connection that keeps the bytes of
// every frame it receives, so that event maps are compared as the server
// wrote them, key by key, and not as a client library decodes them.
type rawDev struct {
	t   *testing.T
	nc  net.Conn
	wmu sync.Mutex

	mu     sync.Mutex
	rid    int
	wait   map[string]chan []byte
	pushes map[string]map[int64][]byte // conv → seq → the push frame's body
	err    error
}

func dialRaw(t *testing.T, env *parleytest.Env, dev parleytest.Device) *rawDev {
	t.Helper()
	nc, err := net.Dial("tcp", env.Addr)
	if err != nil {
		t.Fatal(err)
	}
	d := &rawDev{t: t, nc: nc, wait: map[string]chan []byte{}, pushes: map[string]map[int64][]byte{}}
	t.Cleanup(func() { nc.Close() })
	go d.read()
	if m := d.decode(d.do(wire.Request{T: wire.TAuth, Device: dev.ID, Token: dev.Token})); m.T != wire.TAuthOK {
		t.Fatalf("auth of %s: %s", dev.ID, m.String())
	}
	return d
}

func (d *rawDev) read() {
	fr := wire.NewFrameReader(d.nc, 1<<24)
	for {
		b, err := fr.Next()
		if err != nil {
			d.mu.Lock()
			d.err = err
			d.mu.Unlock()
			return
		}
		body := bytes.Clone(b)
		m, err := wire.DecodeMessage(body)
		if err != nil {
			d.mu.Lock()
			d.err = err
			d.mu.Unlock()
			return
		}
		d.mu.Lock()
		switch {
		case m.Rid != "" && d.wait[m.Rid] != nil:
			d.wait[m.Rid] <- body
			delete(d.wait, m.Rid)
		case m.T == wire.TPush:
			if d.pushes[m.Conv] == nil {
				d.pushes[m.Conv] = map[int64][]byte{}
			}
			if _, dup := d.pushes[m.Conv][m.Seq]; dup {
				d.t.Errorf("%s/%d pushed twice", m.Conv, m.Seq)
			}
			d.pushes[m.Conv][m.Seq] = body
		}
		d.mu.Unlock()
	}
}

// do sends q and returns the body of its reply.
func (d *rawDev) do(q wire.Request) []byte {
	d.t.Helper()
	d.mu.Lock()
	d.rid++
	q.Rid = "r" + strconv.Itoa(d.rid)
	ch := make(chan []byte, 1)
	d.wait[q.Rid] = ch
	d.mu.Unlock()
	frame, err := wire.AppendFrame(nil, &q)
	if err != nil {
		d.t.Fatal(err)
	}
	d.wmu.Lock()
	_, err = d.nc.Write(frame)
	d.wmu.Unlock()
	if err != nil {
		d.t.Fatal(err)
	}
	select {
	case b := <-ch:
		return b
	case <-time.After(10 * time.Second):
		d.mu.Lock()
		defer d.mu.Unlock()
		d.t.Fatalf("no reply to %s (connection: %v)", q.T, d.err)
		return nil
	}
}

func (d *rawDev) decode(b []byte) wire.Message {
	d.t.Helper()
	m, err := wire.DecodeMessage(b)
	if err != nil {
		d.t.Fatal(err)
	}
	return m
}

// push waits for the push of conv/seq and returns its body.
func (d *rawDev) push(conv string, seq int64) []byte {
	d.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d.mu.Lock()
		b, err := d.pushes[conv][seq], d.err
		d.mu.Unlock()
		if b != nil {
			return b
		}
		if err != nil || time.Now().After(deadline) {
			d.t.Fatalf("no push of %s/%d (connection: %v)", conv, seq, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// anyMap decodes a msgpack map generically: every integer as int64
// (whatever width it was written in), bin as []byte, str as string,
// arrays as []any.
func anyMap(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := msgpack.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return normInts(m).(map[string]any)
}

func normInts(v any) any {
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int()
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return int64(rv.Uint())
	}
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			v[k] = normInts(x)
		}
	case []any:
		for i, x := range v {
			v[i] = normInts(x)
		}
	}
	return v
}

// eventMaps are the event maps of a sync_ok (events) or snapshot_ok item
// (items[i].events), generically decoded.
func eventMaps(t *testing.T, v any) []map[string]any {
	t.Helper()
	arr, ok := v.([]any)
	if !ok {
		t.Fatalf("events: %T %v", v, v)
	}
	out := make([]map[string]any, len(arr))
	for i, e := range arr {
		if out[i], ok = e.(map[string]any); !ok {
			t.Fatalf("event: %T %v", e, e)
		}
	}
	return out
}

func seqOf(e map[string]any) int64 { s, _ := e["seq"].(int64); return s }

// diffMaps describes how map got differs from want, key by key ("" when
// they are equal).
func diffMaps(got, want map[string]any) string {
	keys := map[string]bool{}
	for k := range got {
		keys[k] = true
	}
	for k := range want {
		keys[k] = true
	}
	var ks []string
	for k := range keys {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var out []string
	for _, k := range ks {
		g, gok := got[k]
		w, wok := want[k]
		switch {
		case !gok:
			out = append(out, fmt.Sprintf("%s missing (want %s)", k, show(w)))
		case !wok:
			out = append(out, fmt.Sprintf("%s: %s, not expected", k, show(g)))
		case !reflect.DeepEqual(g, w):
			out = append(out, fmt.Sprintf("%s: %s, want %s", k, show(g), show(w)))
		}
	}
	return strings.Join(out, "; ")
}

func show(v any) string {
	if b, ok := v.([]byte); ok {
		return fmt.Sprintf("bin %q", b)
	}
	return fmt.Sprintf("%#v", v)
}

// clientEvent is what the Go client makes of an event map (the client
// package's decoding, then the event map it stands for): it must lose
// nothing.
func clientEvent(t *testing.T, ev wire.Event) map[string]any {
	t.Helper()
	b, err := wire.Marshal(&ev)
	if err != nil {
		t.Fatal(err)
	}
	return anyMap(t, b)
}

// evWant is an expected event map, without seq and ts: kind, sender,
// body (empty unless given) and the other keys given as key, value pairs.
func evWant(kind, sender string, kv ...any) map[string]any {
	m := map[string]any{"kind": kind, "sender": sender, "body": []byte{}}
	for i := 0; i+1 < len(kv); i += 2 {
		v := kv[i+1]
		switch x := v.(type) {
		case string:
			if kv[i] == "body" {
				v = []byte(x)
			}
		case int:
			v = int64(x)
		case []string:
			a := make([]any, len(x))
			for j, s := range x {
				a[j] = s
			}
			v = a
		}
		m[kv[i].(string)] = v
	}
	return m
}

// eventMapFix drives one server: actors act through client connections,
// obs watches through a raw one.
type eventMapFix struct {
	t      *testing.T
	env    *parleytest.Env
	conns  map[string]*client.Conn
	obs    *rawDev
	obsDev parleytest.Device
	window int64 // snapshot_full_max = snapshot_tail
	kinds  map[string]bool
	seen   map[string]map[int64]map[string]any // conv → seq → the event map as last compared
}

// head is conv's head (0 while it does not exist).
func (f *eventMapFix) head(conv string) int64 {
	f.t.Helper()
	var c struct{ Head int64 }
	switch st := f.env.Admin(f.t, "GET", "/v1/conversations/"+conv, nil, &c); st {
	case http.StatusOK:
		return c.Head
	case http.StatusNotFound:
		return 0
	default:
		f.t.Fatalf("GET %s: %d", conv, st)
		return 0
	}
}

// compare reads the newest f.window events of conv that obs can see in
// every way a device can, and checks that they are the same maps: the
// pushes of seqs above before, one sync page, and two snapshot items (the
// full form: gap <= snapshot_full_max, and, once head exceeds it, the tail
// form: the newest snapshot_tail). It returns sync's events by seq.
func (f *eventMapFix) compare(what, conv string, before, head int64) map[int64]map[string]any {
	t := f.t
	t.Helper()
	from := max(0, head-f.window)
	syncBody := f.obs.do(wire.Request{T: wire.TSync, Conv: conv, After: from, Limit: 100, Has: wire.FLimit})
	sm := anyMap(t, syncBody)
	if sm["t"] != wire.TSyncOK || sm["upto"] != head {
		t.Fatalf("%s: sync after %d: %v", what, from, sm)
	}
	byPath := map[string][]map[string]any{"sync": eventMaps(t, sm["events"])}
	synced := map[int64]map[string]any{}
	for _, e := range byPath["sync"] {
		synced[seqOf(e)] = e
	}
	// The Go client decodes the same bytes into the same events.
	for i, ev := range f.obs.decode(syncBody).Events {
		if d := diffMaps(clientEvent(t, ev), byPath["sync"][i]); d != "" {
			t.Errorf("%s: %s/%d: the client's sync event differs from the wire's: %s", what, conv, ev.Seq, d)
		}
	}

	snapBody := f.obs.do(wire.Request{T: wire.TSnapshot, Convs: []wire.ConvAfter{{Conv: conv, After: from}, {Conv: conv, After: 0}}})
	snap := anyMap(t, snapBody)
	items, _ := snap["items"].([]any)
	if snap["t"] != wire.TSnapshotOK || len(items) != 2 {
		t.Fatalf("%s: snapshot: %v", what, snap)
	}
	for i, name := range []string{"snapshot (full)", "snapshot (tail)"} {
		it := items[i].(map[string]any)
		if it["error"] != nil || it["head"] != head {
			t.Fatalf("%s: %s: %v", what, name, it)
		}
		if i == 1 && head <= f.window {
			name = "snapshot (full, from 0)"
		}
		byPath[name] = eventMaps(t, it["events"])
	}
	dm := f.obs.decode(snapBody)
	for i := range dm.Items {
		for j, ev := range dm.Items[i].Events {
			if d := diffMaps(clientEvent(t, ev), eventMaps(t, items[i].(map[string]any)["events"])[j]); d != "" {
				t.Errorf("%s: %s/%d: the client's snapshot event differs from the wire's: %s", what, conv, ev.Seq, d)
			}
		}
	}

	var pushed []map[string]any
	for s := before + 1; s <= head; s++ {
		body := f.obs.push(conv, s)
		p := anyMap(t, body)
		if p["conv"] != conv || p["t"] != wire.TPush {
			t.Fatalf("%s: push %v", what, p)
		}
		// The Go client's push → event.
		pm := f.obs.decode(body)
		delete(p, "t")
		delete(p, "conv")
		if d := diffMaps(clientEvent(t, pm.Event()), p); d != "" {
			t.Errorf("%s: %s/%d: the client's pushed event differs from the wire's: %s", what, conv, s, d)
		}
		pushed = append(pushed, p)
	}
	byPath["push"] = pushed

	for _, path := range []string{"push", "snapshot (full)", "snapshot (tail)", "snapshot (full, from 0)"} {
		for _, e := range byPath[path] {
			s := seqOf(e)
			want, ok := synced[s]
			if !ok {
				t.Errorf("%s: %s returned %s/%d, sync did not", what, path, conv, s)
				continue
			}
			if d := diffMaps(e, want); d != "" {
				t.Errorf("%s: %s/%d (%v): %s differs from sync: %s", what, conv, s, want["kind"], path, d)
			}
		}
	}
	// Both snapshot items hold the newest events, as sync does.
	var syncSeqs []int64
	for _, e := range byPath["sync"] {
		syncSeqs = append(syncSeqs, seqOf(e))
	}
	for path, evs := range byPath {
		if !strings.HasPrefix(path, "snapshot") {
			continue
		}
		var seqs []int64
		for _, e := range evs {
			seqs = append(seqs, seqOf(e))
		}
		if !slices.Equal(seqs, syncSeqs) {
			t.Errorf("%s: %s returned seqs %v, sync %v", what, path, seqs, syncSeqs)
		}
	}
	if f.seen[conv] == nil {
		f.seen[conv] = map[int64]map[string]any{}
	}
	for s, e := range synced {
		f.seen[conv][s] = e
		f.kinds[e["kind"].(string)] = true
	}
	return synced
}

// step runs do, which must append one event per element of want to conv
// (want: each event's map without seq and ts), and compares every path's
// view of the newest events. It returns the new events' seqs and sync's
// events by seq.
func (f *eventMapFix) step(what, conv string, do func(), want ...map[string]any) ([]int64, map[int64]map[string]any) {
	f.t.Helper()
	before := f.head(conv)
	return f.check(what, conv, before, func() string { do(); return conv }, want)
}

// create is step for a request that creates the conversation: do returns
// its id.
func (f *eventMapFix) create(what string, do func() string, want ...map[string]any) string {
	f.t.Helper()
	var conv string
	f.check(what, "", 0, func() string { conv = do(); return conv }, want)
	return conv
}

func (f *eventMapFix) check(what, conv string, before int64, do func() string, want []map[string]any) ([]int64, map[int64]map[string]any) {
	t := f.t
	t.Helper()
	conv = do()
	head := f.head(conv)
	if head != before+int64(len(want)) {
		t.Fatalf("%s: head %d -> %d, want %d new events", what, before, head, len(want))
	}
	got := f.compare(what, conv, before, head)
	var seqs []int64
	for i, w := range want {
		s := before + 1 + int64(i)
		seqs = append(seqs, s)
		e := maps.Clone(got[s])
		delete(e, "seq")
		delete(e, "ts")
		if d := diffMaps(e, w); d != "" {
			t.Errorf("%s: event %s/%d: %s", what, conv, s, d)
		}
	}
	return seqs, got
}

func (f *eventMapFix) do(who string, q wire.Request) wire.Message {
	f.t.Helper()
	m, err := f.conns[who].Do(ctx(f.t), q)
	if err != nil {
		f.t.Fatalf("%s: %s: %v", who, q.T, err)
	}
	return m
}

func (f *eventMapFix) admin(method, path string, body any) {
	f.t.Helper()
	if st := f.env.Admin(f.t, method, path, body, nil); st/100 != 2 {
		f.t.Fatalf("%s %s: status %d", method, path, st)
	}
}

// TestEventMapEveryPath: every kind of event the server writes reaches a
// member's device as the same map (docs/protocol.md §3, the event map)
// by push, by sync and by snapshot (its full and its tail form), in every
// fan-out tier: the same keys with the same values, and later changes
// (an edit, a recall) shown the same way by sync and snapshot. The Go
// client decodes each of them without losing a key.
func TestEventMapEveryPath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		tier                string
		writeMax, onlineMax int
	}{
		{"push", 200, 2000}, // 4-6 members: push
		{"online", 3, 100},  // online
		{"pull", 2, 3},      // pull
	} {
		t.Run(tc.tier, func(t *testing.T) { eventMapScenario(t, tc.tier, tc.writeMax, tc.onlineMax) })
	}
}

func eventMapScenario(t *testing.T, tier string, writeMax, onlineMax int) {
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	cfg.WriteFanoutMax, cfg.OnlineFanoutMax = writeMax, onlineMax
	// A window of 3: the full form of a snapshot from head-3, and the
	// tail form from 0, both return the newest three events.
	cfg.SnapshotFullMax, cfg.SnapshotTail = 3, 3
	env := parleytest.Start(t, cfg)
	f := &eventMapFix{t: t, env: env, conns: map[string]*client.Conn{}, window: 3,
		kinds: map[string]bool{}, seen: map[string]map[int64]map[string]any{}}
	for _, u := range []string{"own", "adm", "mem", "x", "y", "z"} {
		f.conns[u], _ = dial(t, env, env.User(t, u, 1)[0])
	}
	f.obsDev = env.User(t, "obs", 1)[0]
	f.obs = dialRaw(t, env, f.obsDev)
	mode := func(conv, want string) {
		t.Helper()
		var c struct{ Mode string }
		if st := env.Admin(t, "GET", "/v1/conversations/"+conv, nil, &c); st != http.StatusOK || c.Mode != want {
			t.Fatalf("%s: mode %q (status %d), want %q", conv, c.Mode, st, want)
		}
	}
	const g = "g"
	okDo := func(_ wire.Message, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	hour := time.Now().Add(time.Hour).UnixMilli()
	ts := func(m map[string]any) int64 { return m["ts"].(int64) }

	// Membership: a group made by conv_create.
	f.create("conv_create", func() string {
		return f.do("own", wire.Request{T: wire.TConvCreate, Kind: wire.ConvGroup, Conv: g, Title: "T0", Members: []string{"adm", "mem", "obs", "x", "y"}}).Conv
	}, evWant("join", "own", "users", []string{"adm", "mem", "obs", "own", "x", "y"}))
	mode(g, tier)

	// Roles.
	f.step("role admin", g, func() {
		f.do("own", wire.Request{T: wire.TRole, Conv: g, User: "adm", Role: wire.RoleAdmin})
	}, evWant("update", "own", "users", []string{"adm"}, "role", "admin"))

	// Messages: plain, empty, binary, with mentions (a non-member and an
	// unknown user dropped), mention_all, both.
	seqs, _ := f.step("msg", g, func() { f.do("adm", wire.Request{T: wire.TSend, Conv: g, Cmid: "c-plain", Body: []byte("plain")}) },
		evWant("msg", "adm", "cmid", "c-plain", "body", "plain"))
	plain := seqs[0]
	f.step("msg, empty body", g, func() { f.do("adm", wire.Request{T: wire.TSend, Conv: g, Cmid: "c-empty", Body: []byte{}}) },
		evWant("msg", "adm", "cmid", "c-empty"))
	f.step("msg, binary body", g, func() {
		f.do("adm", wire.Request{T: wire.TSend, Conv: g, Cmid: "c-bin", Body: []byte{0xff, 0, 0x80}})
	}, evWant("msg", "adm", "cmid", "c-bin", "body", string([]byte{0xff, 0, 0x80})))
	f.step("msg with mentions", g, func() {
		f.do("mem", wire.Request{T: wire.TSend, Conv: g, Cmid: "c-mention", Body: []byte("hi @obs @adm"), Mentions: []string{"obs", "z", "adm", "nobody"}})
	}, evWant("msg", "mem", "cmid", "c-mention", "body", "hi @obs @adm", "mentions", []string{"obs", "adm"}))
	f.step("msg with mention_all", g, func() {
		f.do("mem", wire.Request{T: wire.TSend, Conv: g, Cmid: "c-all", Body: []byte("hi @all"), MentionAll: true})
	}, evWant("msg", "mem", "cmid", "c-all", "body", "hi @all"))
	f.step("msg with mention_all and mentions", g, func() {
		f.do("mem", wire.Request{T: wire.TSend, Conv: g, Cmid: "c-all-x", Body: []byte("hi @all @x"), MentionAll: true, Mentions: []string{"x"}})
	}, evWant("msg", "mem", "cmid", "c-all-x", "body", "hi @all @x", "mentions", []string{"x"}))
	f.step("msg with mentions of non-members only", g, func() {
		f.do("mem", wire.Request{T: wire.TSend, Conv: g, Cmid: "c-none", Body: []byte("hi @z"), Mentions: []string{"z"}})
	}, evWant("msg", "mem", "cmid", "c-none", "body", "hi @z"))

	// Edits: a message edited twice; the message then reads with the
	// newest body and `edited`, each edit with its own body.
	seqs, _ = f.step("msg to edit", g, func() {
		f.do("adm", wire.Request{T: wire.TSend, Conv: g, Cmid: "c-edit", Body: []byte("v1"), Mentions: []string{"mem"}})
	}, evWant("msg", "adm", "cmid", "c-edit", "body", "v1", "mentions", []string{"mem"}))
	edited := seqs[0]
	f.step("edit", g, func() { f.do("adm", wire.Request{T: wire.TEdit, Conv: g, Seq: edited, Body: []byte("v2")}) },
		evWant("edit", "adm", "target", edited, "body", "v2"))
	seqs, got := f.step("edit again", g, func() { f.do("adm", wire.Request{T: wire.TEdit, Conv: g, Seq: edited, Body: []byte("v3")}) },
		evWant("edit", "adm", "target", edited, "body", "v3"))
	if d := diffMaps(got[edited], mapWith(evWant("msg", "adm", "cmid", "c-edit", "body", "v3", "mentions", []string{"mem"}),
		"seq", edited, "ts", ts(got[edited]), "edited", ts(got[seqs[0]]))); d != "" {
		t.Errorf("the edited message: %s", d)
	}
	if d := diffMaps(got[edited+1], mapWith(evWant("edit", "adm", "target", edited, "body", "v2"), "seq", edited+1, "ts", ts(got[edited+1]))); d != "" {
		t.Errorf("the first edit after the second: %s", d)
	}

	// Recalls: an edited message with mentions recalled by its sender
	// (its body and its edits' bodies emptied), and another member's
	// message recalled by an admin.
	seqs, _ = f.step("msg to recall", g, func() {
		f.do("mem", wire.Request{T: wire.TSend, Conv: g, Cmid: "c-recall", Body: []byte("oops @obs"), Mentions: []string{"obs"}})
	}, evWant("msg", "mem", "cmid", "c-recall", "body", "oops @obs", "mentions", []string{"obs"}))
	recalled := seqs[0]
	f.step("edit before the recall", g, func() { f.do("mem", wire.Request{T: wire.TEdit, Conv: g, Seq: recalled, Body: []byte("oops!")}) },
		evWant("edit", "mem", "target", recalled, "body", "oops!"))
	seqs, got = f.step("recall", g, func() { f.do("mem", wire.Request{T: wire.TRecall, Conv: g, Seq: recalled}) },
		evWant("recall", "mem", "target", recalled))
	if d := diffMaps(got[recalled], mapWith(evWant("msg", "mem", "cmid", "c-recall", "mentions", []string{"obs"}, "recalled", true),
		"seq", recalled, "ts", ts(got[recalled]), "edited", ts(got[recalled+1]))); d != "" {
		t.Errorf("the recalled message: %s", d)
	}
	if d := diffMaps(got[recalled+1], mapWith(evWant("edit", "mem", "target", recalled), "seq", recalled+1, "ts", ts(got[recalled+1]))); d != "" {
		t.Errorf("the edit of the recalled message: %s", d)
	}
	f.step("recall by an admin", g, func() { f.do("adm", wire.Request{T: wire.TRecall, Conv: g, Seq: plain}) },
		evWant("recall", "adm", "target", plain))

	// Mutes.
	f.step("mute", g, func() { f.do("adm", wire.Request{T: wire.TMemberMute, Conv: g, User: "mem", MutedUntil: hour}) },
		evWant("update", "adm", "users", []string{"mem"}, "muted_until", hour))
	f.step("unmute", g, func() { f.do("adm", wire.Request{T: wire.TMemberMute, Conv: g, User: "mem", MutedUntil: 0}) },
		evWant("update", "adm", "users", []string{"mem"}, "muted_until", 0))

	// Settings of the group.
	title := "T1"
	f.step("conv_update title", g, func() { okDo(f.conns["own"].UpdateConv(ctx(t), g, &title, "")) },
		evWant("update", "own", "title", "T1"))
	f.step("conv_update invite", g, func() { okDo(f.conns["adm"].UpdateConv(ctx(t), g, nil, wire.InviteAdmins)) },
		evWant("update", "adm", "invite", "admins"))
	empty := ""
	f.step("conv_update both, title cleared", g, func() { okDo(f.conns["own"].UpdateConv(ctx(t), g, &empty, wire.InviteAll)) },
		evWant("update", "own", "title", "", "invite", "all"))

	// Bans: of a member (an update, then its leave), of a non-member,
	// and unbans.
	f.step("ban of a member", g, func() { f.do("adm", wire.Request{T: wire.TBan, Conv: g, User: "x"}) },
		evWant("update", "adm", "users", []string{"x"}, "banned", true), evWant("leave", "adm", "users", []string{"x"}))
	f.step("ban of a non-member", g, func() { f.do("adm", wire.Request{T: wire.TBan, Conv: g, User: "z"}) },
		evWant("update", "adm", "users", []string{"z"}, "banned", true))
	f.step("unban", g, func() { f.do("own", wire.Request{T: wire.TUnban, Conv: g, User: "x"}) },
		evWant("update", "own", "users", []string{"x"}, "banned", false))
	f.step("unban of the non-member", g, func() { f.do("own", wire.Request{T: wire.TUnban, Conv: g, User: "z"}) },
		evWant("update", "own", "users", []string{"z"}, "banned", false))

	// Membership: members_add (of several), leave, members_remove.
	f.step("members_add", g, func() { f.do("adm", wire.Request{T: wire.TMembersAdd, Conv: g, Users: []string{"z", "x"}}) },
		evWant("join", "adm", "users", []string{"x", "z"}))
	f.step("leave", g, func() { f.do("x", wire.Request{T: wire.TLeave, Conv: g}) },
		evWant("leave", "x", "users", []string{"x"}))
	f.step("members_remove", g, func() { f.do("own", wire.Request{T: wire.TMembersRemove, Conv: g, Users: []string{"z", "y"}}) },
		evWant("leave", "own", "users", []string{"y", "z"}))

	// The admin API's changes (sender "").
	f.step("admin add", g, func() { f.admin("POST", "/v1/conversations/"+g+"/members", map[string]any{"users": []string{"y"}}) },
		evWant("join", "", "users", []string{"y"}))
	f.step("admin removal", g, func() { f.admin("DELETE", "/v1/conversations/"+g+"/members/y", nil) },
		evWant("leave", "", "users", []string{"y"}))
	f.step("admin role", g, func() { f.admin("PUT", "/v1/conversations/"+g+"/members/mem/role", map[string]any{"role": "admin"}) },
		evWant("update", "", "users", []string{"mem"}, "role", "admin"))
	// Ownership handed over, and a role taken back.
	f.step("role owner", g, func() { f.do("own", wire.Request{T: wire.TRole, Conv: g, User: "adm", Role: wire.RoleOwner}) },
		evWant("update", "own", "users", []string{"adm"}, "role", "owner"))
	f.step("role member", g, func() { f.do("adm", wire.Request{T: wire.TRole, Conv: g, User: "mem", Role: wire.RoleMember}) },
		evWant("update", "adm", "users", []string{"mem"}, "role", "member"))
	mode(g, tier)

	// What appends nothing: clear and conv_settings of another member.
	h := f.head(g)
	f.do("mem", wire.Request{T: wire.TClear, Conv: g, Seq: h})
	f.do("mem", wire.Request{T: wire.TConvSettings, Conv: g, MutedUntil: hour})
	if f.head(g) != h {
		t.Fatalf("clear and conv_settings appended events: head %d -> %d", h, f.head(g))
	}

	// A group made through the admin API, and a direct conversation.
	f.create("admin create", func() string {
		f.admin("POST", "/v1/conversations", map[string]any{"id": "g2", "kind": "group", "members": []string{"obs", "own", "adm", "mem"}, "title": "G2"})
		return "g2"
	}, evWant("join", "", "users", []string{"adm", "mem", "obs", "own"}))
	direct := f.create("conv_create direct", func() string {
		return f.do("own", wire.Request{T: wire.TConvCreate, Kind: wire.ConvDirect, Members: []string{"obs"}}).Conv
	}, evWant("join", "own", "users", []string{"obs", "own"}))
	f.step("direct msg with a mention", direct, func() {
		f.do("own", wire.Request{T: wire.TSend, Conv: direct, Cmid: "d-1", Body: []byte("@obs"), Mentions: []string{"obs"}})
	}, evWant("msg", "own", "cmid", "d-1", "body", "@obs", "mentions", []string{"obs"}))

	for _, k := range []string{"msg", "join", "leave", "recall", "edit", "update"} {
		if !f.kinds[k] {
			t.Errorf("no %s event compared", k)
		}
	}

	// Last, the whole log of g once more: sync, and the full form of a
	// snapshot (through a second gateway on the same database, whose
	// snapshot_full_max covers it), give every event as it reads now:
	// as compared when it was among the newest, but for the message an
	// admin recalled since.
	cfg2 := env.Cfg
	cfg2.GatewayID, cfg2.SnapshotFullMax, cfg2.SnapshotTail = "", 1000, 50
	env2 := parleytest.Start(t, cfg2)
	obs2 := dialRaw(t, env2, f.obsDev)
	head := f.head(g)
	sm := anyMap(t, obs2.do(wire.Request{T: wire.TSync, Conv: g, After: 0, Limit: 1000, Has: wire.FLimit}))
	snap := anyMap(t, obs2.do(wire.Request{T: wire.TSnapshot, Convs: []wire.ConvAfter{{Conv: g, After: 0}}}))
	items, _ := snap["items"].([]any)
	if sm["upto"] != head || len(items) != 1 {
		t.Fatalf("sync %v, snapshot %v", sm, snap)
	}
	all := map[string][]map[string]any{"sync": eventMaps(t, sm["events"]), "snapshot": eventMaps(t, items[0].(map[string]any)["events"])}
	want := f.seen[g]
	want[plain] = mapWith(maps.Clone(want[plain]), "recalled", true, "body", []byte{})
	for path, evs := range all {
		if int64(len(evs)) != head {
			t.Errorf("%s of the whole log: %d events, want %d", path, len(evs), head)
		}
		for _, e := range evs {
			if d := diffMaps(e, want[seqOf(e)]); d != "" {
				t.Errorf("%s of the whole log: %s/%d: %s", path, g, seqOf(e), d)
			}
		}
	}
}

func mapWith(m map[string]any, kv ...any) map[string]any {
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}
