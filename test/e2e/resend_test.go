package e2e_test

import (
	"fmt"
	"testing"

	"github.com/parley-im/parley/test/parleytest"
)

// TestResendOfConfirmedSendAllocatesNoSeq: a resend of a send that was
// already confirmed (the same cmid, from the sending device, another
// device of the sender, and another gateway) is answered with the
// original seq and ts and allocates nothing (docs/protocol.md §4, send):
// head does not move, no hole is written, and the next message takes the
// seq right after the original.
func TestResendOfConfirmedSendAllocatesNoSeq(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	gw1 := parleytest.Start(t, cfg)
	gw2 := parleytest.Start(t, cfg)
	ana := gw1.User(t, "ana", 2)
	gw1.User(t, "ben", 1)
	gw1.Group(t, "g", "ana", "ben")
	c1, _ := dial(t, gw1, ana[0])
	c2, _ := dial(t, gw2, ana[1])

	head := func() int64 { return headOf(t, gw1, "g") }
	orig := mustSend(t, c1, "g", "m1", []byte("hello"))
	if orig.Dup || orig.Seq != head() {
		t.Fatalf("first send: %+v, head %d", orig, head())
	}
	for i := 0; i < 6; i++ {
		conn, where := c1, "the sending device"
		if i%2 == 1 {
			conn, where = c2, "another device on another gateway"
		}
		r, err := conn.Send(ctx(t), "g", "m1", []byte("hello"))
		if err != nil || !r.Dup || r.Seq != orig.Seq || r.Ts != orig.Ts {
			t.Fatalf("resend %d from %s: %+v %v; want dup of seq %d ts %d", i+1, where, r, err, orig.Seq, orig.Ts)
		}
		if h := head(); h != orig.Seq {
			t.Fatalf("resend %d from %s moved head %d -> %d", i+1, where, orig.Seq, h)
		}
	}
	next := mustSend(t, c1, "g", "m2", []byte("next"))
	if next.Seq != orig.Seq+1 {
		t.Fatalf("the next message got seq %d, want %d (the resends left holes)", next.Seq, orig.Seq+1)
	}
	s, err := c2.Sync(ctx(t), "g", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range s.Events {
		got = append(got, fmt.Sprintf("%d:%s", e.Seq, e.Kind))
	}
	if s.Head != next.Seq || s.Upto != s.Head || s.More || fmt.Sprint(got) != fmt.Sprintf("[1:join %d:msg %d:msg]", orig.Seq, next.Seq) {
		t.Fatalf("sync: head %d upto %d more %v events %v", s.Head, s.Upto, s.More, got)
	}
}
