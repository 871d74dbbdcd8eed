package e2e_test

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/wire"
)

// headOf returns conv's head through the admin API.
func headOf(t *testing.T, env *parleytest.Env, conv string) int64 {
	t.Helper()
	var c struct{ Head int64 }
	if st := env.Admin(t, "GET", "/v1/conversations/"+conv, nil, &c); st != http.StatusOK {
		t.Fatalf("GET %s: %d", conv, st)
	}
	return c.Head
}

func convItem(t *testing.T, c *client.Conn, conv string) wire.Item {
	t.Helper()
	r, err := c.Convs(ctx(t), 100, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range r.Items {
		if it.Conv == conv {
			return it
		}
	}
	t.Fatalf("convs has no %s: %+v", conv, r.Items)
	return wire.Item{}
}

func eventAt(evs []wire.Event, seq int64) (wire.Event, bool) {
	for _, e := range evs {
		if e.Seq == seq {
			return e, true
		}
	}
	return wire.Event{}, false
}

// An edit is an event of its own: it takes a seq, reaches every member
// like a message, and from then on the edited message reads with the new
// body and `edited` in sync and snapshot. It never counts as unread, and a
// retry (the same body again) appends nothing.
func TestEditEverywhere(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	env := parleytest.Start(t, cfg)
	ana := env.User(t, "ana", 2)
	ben := env.User(t, "ben", 1)[0]
	env.Group(t, "g", "ana", "ben")
	ca, _ := dial(t, env, ana[0])
	ca2, fa2 := dial(t, env, ana[1])
	cb, fb := dial(t, env, ben)
	_ = ca2

	m, err := ca.Send(ctx(t), "g", "m1", []byte("first"))
	if err != nil {
		t.Fatal(err)
	}
	waitPush(t, fb, "g", m.Seq)
	ed, err := ca.Edit(ctx(t), "g", m.Seq, []byte("second"))
	if err != nil {
		t.Fatal(err)
	}
	if ed.T != wire.TEditOK || ed.Target != m.Seq || ed.Seq != m.Seq+1 {
		t.Fatalf("edit_ok %+v, want seq %d target %d", ed, m.Seq+1, m.Seq)
	}
	for who, frames := range map[string]chan wire.Message{"ben": fb, "ana's other device": fa2} {
		p := waitPush(t, frames, "g", ed.Seq)
		if p.Kind != wire.KindEdit || p.Target != m.Seq || string(p.Body) != "second" || p.Sender != "ana" {
			t.Fatalf("%s: edit push %+v", who, p)
		}
	}
	// A retry of the same edit is answered with the same seq.
	again, err := ca.Edit(ctx(t), "g", m.Seq, []byte("second"))
	if err != nil || again.Seq != ed.Seq {
		t.Fatalf("edit retried: %+v %v, want seq %d", again, err, ed.Seq)
	}
	if h := headOf(t, env, "g"); h != ed.Seq {
		t.Fatalf("head %d after a retried edit, want %d", h, ed.Seq)
	}

	check := func(where string, evs []wire.Event) {
		t.Helper()
		msg, ok := eventAt(evs, m.Seq)
		if !ok || string(msg.Body) != "second" || msg.Edited == 0 || msg.Kind != wire.KindMsg {
			t.Fatalf("%s: edited message %+v (found %v)", where, msg, ok)
		}
		e, ok := eventAt(evs, ed.Seq)
		if !ok || e.Kind != wire.KindEdit || e.Target != m.Seq || string(e.Body) != "second" || e.Edited != 0 {
			t.Fatalf("%s: edit event %+v (found %v)", where, e, ok)
		}
		if msg.Edited != e.Ts {
			t.Fatalf("%s: edited %d, want the edit's ts %d", where, msg.Edited, e.Ts)
		}
	}
	s, err := cb.Sync(ctx(t), "g", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	check("sync", s.Events)
	snap, err := cb.Snapshot(ctx(t), []wire.ConvAfter{{Conv: "g", After: 0}})
	if err != nil {
		t.Fatal(err)
	}
	check("snapshot", snap.Items[0].Events)
	// The tail form of a snapshot (gap above snapshot_full_max) too.
	for i := range cfg.SnapshotFullMax {
		if _, err := ca.Send(ctx(t), "g", fmt.Sprint("f", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	ed2, err := ca.Edit(ctx(t), "g", m.Seq, []byte("third"))
	if err != nil {
		t.Fatal(err)
	}
	snap, err = cb.Snapshot(ctx(t), []wire.ConvAfter{{Conv: "g", After: m.Seq - 1}})
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := eventAt(snap.Items[0].Events, ed2.Seq); !ok || string(e.Body) != "third" || e.Target != m.Seq {
		t.Fatalf("snapshot tail: edit event %+v (%v)", e, ok)
	}
	s, err = cb.Sync(ctx(t), "g", m.Seq-1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Events) != 1 || string(s.Events[0].Body) != "third" || s.Events[0].Edited == 0 {
		t.Fatalf("sync after a second edit: %+v", s.Events)
	}

	// Edits are never unread: ben has 1 + fullMax messages of ana's.
	if it := convItem(t, cb, "g"); it.Unread != int64(1+cfg.SnapshotFullMax) {
		t.Fatalf("ben's unread %d, want %d (edits do not count)", it.Unread, 1+cfg.SnapshotFullMax)
	}
	r, err := cb.Read(ctx(t), "g", headOf(t, env, "g"))
	if err != nil || r.Unread != 0 {
		t.Fatalf("read to head: %+v %v", r, err)
	}
}

// Refused edits change nothing: no seq, no hole, the message unchanged.
func TestEditRefused(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	cfg.EditWindow = time.Second
	env := parleytest.Start(t, cfg)
	ana := env.User(t, "ana", 1)[0]
	ben := env.User(t, "ben", 1)[0]
	out := env.User(t, "out", 1)[0]
	env.Group(t, "g", "ana", "ben")
	ca, _ := dial(t, env, ana)
	cb, _ := dial(t, env, ben)
	co, _ := dial(t, env, out)
	old, err := ca.Send(ctx(t), "g", "old", []byte("old"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(cfg.EditWindow + 100*time.Millisecond) // the window passing is what is tested
	m, err := ca.Send(ctx(t), "g", "m", []byte("body"))
	if err != nil {
		t.Fatal(err)
	}
	gone, err := ca.Send(ctx(t), "g", "gone", []byte("body"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Recall(ctx(t), "g", gone.Seq); err != nil {
		t.Fatal(err)
	}
	before := headOf(t, env, "g")
	want := func(what string, err error, code wire.Code) {
		t.Helper()
		if wire.CodeOf(err) != code {
			t.Fatalf("%s: %v, want %s", what, err, code)
		}
		if h := headOf(t, env, "g"); h != before {
			t.Fatalf("%s moved head %d -> %d", what, before, h)
		}
	}
	_, err = cb.Edit(ctx(t), "g", m.Seq, []byte("mine now"))
	want("edit of another member's message", err, wire.NotSender)
	_, err = ca.Edit(ctx(t), "g", 1, []byte("x"))
	want("edit of a join", err, wire.NotFound)
	_, err = ca.Edit(ctx(t), "g", before+5, []byte("x"))
	want("edit above head", err, wire.NotFound)
	_, err = ca.Edit(ctx(t), "g", gone.Seq, []byte("x"))
	want("edit of a recalled message", err, wire.NotFound)
	_, err = ca.Edit(ctx(t), "g", gone.Seq+1, []byte("x"))
	want("edit of a recall event", err, wire.NotFound)
	_, err = ca.Edit(ctx(t), "g", old.Seq, []byte("x"))
	want("edit after edit_window", err, wire.EditWindow)
	_, err = ca.Edit(ctx(t), "g", m.Seq, bytes.Repeat([]byte("x"), cfg.MaxBody+1))
	want("edit over max_body", err, wire.TooLarge)
	_, err = co.Edit(ctx(t), "g", m.Seq, []byte("x"))
	want("edit by a user who was never a member", err, wire.NotMember)
	_, err = ca.Edit(ctx(t), "no-such-conv", 2, []byte("x"))
	want("edit in a conversation that does not exist", err, wire.NotMember)
	if _, err := ca.Leave(ctx(t), "g"); err != nil {
		t.Fatal(err)
	}
	before = headOf(t, env, "g")
	_, err = ca.Edit(ctx(t), "g", m.Seq, []byte("x"))
	want("edit by a former member", err, wire.NotMember)

	s, err := cb.Sync(ctx(t), "g", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range s.Events {
		if e.Edited != 0 || e.Kind == wire.KindEdit {
			t.Fatalf("a refused edit left a trace: %+v", e)
		}
	}
	if e, _ := eventAt(s.Events, m.Seq); string(e.Body) != "body" {
		t.Fatalf("message body %q after refused edits", e.Body)
	}
}

// clear ("delete for me") hides the events up to its position from every
// device of the user who cleared, in sync and snapshot (upto still covers
// them), raises the read position, shows in convs, and changes nothing for
// the other members.
func TestClear(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	env := parleytest.Start(t, cfg)
	ana := env.User(t, "ana", 1)[0]
	ben := env.User(t, "ben", 2)
	out := env.User(t, "out", 1)[0]
	env.Group(t, "g", "ana", "ben")
	ca, _ := dial(t, env, ana)
	cb, _ := dial(t, env, ben[0])
	cb2, fb2 := dial(t, env, ben[1])
	co, _ := dial(t, env, out)
	var seqs []int64
	for i := range 5 {
		m, err := ca.Send(ctx(t), "g", fmt.Sprint("m", i), []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, m.Seq)
	}
	head := headOf(t, env, "g")
	cut := seqs[2]
	before := head
	want := func(what string, err error, code wire.Code) {
		t.Helper()
		if wire.CodeOf(err) != code {
			t.Fatalf("%s: %v, want %s", what, err, code)
		}
		if h := headOf(t, env, "g"); h != before {
			t.Fatalf("%s moved head %d -> %d", what, before, h)
		}
		if it := convItem(t, cb, "g"); it.Cleared != 0 || it.Read != 0 {
			t.Fatalf("%s changed ben's positions: %+v", what, it)
		}
	}
	_, err := cb.Clear(ctx(t), "g", head+1)
	want("clear beyond head", err, wire.CursorAhead)
	_, err = co.Clear(ctx(t), "g", 1)
	want("clear by a user who was never a member", err, wire.NotMember)
	_, err = cb.Clear(ctx(t), "no-such-conv", 1)
	want("clear of a conversation that does not exist", err, wire.NotMember)

	r, err := cb.Clear(ctx(t), "g", cut)
	if err != nil {
		t.Fatal(err)
	}
	if r.T != wire.TClearOK || r.Cleared != cut || r.Read != cut || r.Unread != 2 {
		t.Fatalf("clear_ok %+v, want cleared = read = %d, unread 2", r, cut)
	}
	if h := headOf(t, env, "g"); h != head {
		t.Fatalf("clear moved head %d -> %d", head, h)
	}
	// ben's other device hears of the read position.
	deadline := time.After(5 * time.Second)
	for got := false; !got; {
		select {
		case f := <-fb2:
			got = f.T == wire.TReadChanged && f.Conv == "g" && f.Read == cut
		case <-deadline:
			t.Fatal("no read_changed on ben's other device")
		}
	}
	// A lower clear changes nothing (max merge).
	if r, err := cb2.Clear(ctx(t), "g", 1); err != nil || r.Cleared != cut || r.Read != cut {
		t.Fatalf("lower clear: %+v %v", r, err)
	}
	for i, c := range []*client.Conn{cb, cb2} {
		s, err := c.Sync(ctx(t), "g", 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if s.Upto != head || len(s.Events) != 2 || s.Events[0].Seq != seqs[3] {
			t.Fatalf("ben device %d: sync upto %d events %+v, want upto %d and seqs above %d", i, s.Upto, s.Events, head, cut)
		}
		// A page of invisible seqs is still covered.
		s, err = c.Sync(ctx(t), "g", 0, 1)
		if err != nil || s.Upto != seqs[3] || len(s.Events) != 1 {
			t.Fatalf("ben device %d: sync limit 1: %+v %v", i, s, err)
		}
		snap, err := c.Snapshot(ctx(t), []wire.ConvAfter{{Conv: "g", After: 0}})
		if err != nil || len(snap.Items[0].Events) != 2 || snap.Items[0].Events[0].Seq != seqs[3] || snap.Items[0].Read != cut || snap.Items[0].Unread != 2 {
			t.Fatalf("ben device %d: snapshot %+v %v", i, snap.Items, err)
		}
		if it := convItem(t, c, "g"); it.Cleared != cut || it.Read != cut || it.Unread != 2 {
			t.Fatalf("ben device %d: convs %+v", i, it)
		}
	}
	// The tail form of a snapshot hides cleared events too, and counts
	// none of them as skipped.
	for i := range cfg.SnapshotFullMax + 10 {
		if _, err := ca.Send(ctx(t), "g", fmt.Sprint("f", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	head = headOf(t, env, "g")
	bigCut := head - 5
	if _, err := cb.Clear(ctx(t), "g", bigCut); err != nil {
		t.Fatal(err)
	}
	snap, err := cb.Snapshot(ctx(t), []wire.ConvAfter{{Conv: "g", After: 0}})
	if err != nil || len(snap.Items[0].Events) != 5 || snap.Items[0].Skipped != 0 || snap.Items[0].Events[0].Seq != bigCut+1 {
		t.Fatalf("snapshot tail after clear: %+v %v", snap.Items, err)
	}
	// ana sees everything.
	s, err := ca.Sync(ctx(t), "g", 0, 1000)
	if err != nil || int64(len(s.Events)) != head {
		t.Fatalf("ana's sync after ben's clears: %d events, want %d (%v)", len(s.Events), head, err)
	}
	if it := convItem(t, ca, "g"); it.Cleared != 0 || it.Read != 0 {
		t.Fatalf("ana's convs after ben's clears: %+v", it)
	}
}
