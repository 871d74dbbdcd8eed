package e2e_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/wire"
)

func TestSmokeReadConvsRecall(t *testing.T) {
	t.Parallel()
	env := parleytest.Start(t, parleytest.Config(t))
	ana := env.User(t, "ana", 1)
	ben := env.User(t, "ben", 2)
	env.Group(t, "c-ab", "ana", "ben")
	ca, _ := dial(t, env, ana[0])
	b1, _ := dial(t, env, ben[0])
	_, f2 := dial(t, env, ben[1])
	var last int64
	for i := 0; i < 5; i++ {
		r, err := ca.Send(ctx(t), "c-ab", fmt.Sprint(i), []byte("m"))
		if err != nil {
			t.Fatal(err)
		}
		last = r.Seq
	}
	r, err := b1.Read(ctx(t), "c-ab", 4)
	if err != nil || r.Read != 4 || r.Unread != 2 {
		t.Fatalf("read: %+v %v", r, err)
	}
	deadline := time.After(5 * time.Second)
	for got := false; !got; {
		select {
		case m := <-f2:
			got = m.T == wire.TReadChanged && m.Read == 4 && m.Unread == 2
		case <-deadline:
			t.Fatal("no read_changed on the other device")
		}
	}
	c, err := b1.Convs(ctx(t), 0, "")
	if err != nil || len(c.Items) != 1 || c.Items[0].Unread != 2 || c.Items[0].Head != last || c.Items[0].Mode != "push" {
		t.Fatalf("convs: %+v %v", c, err)
	}
	rc, err := ca.Recall(ctx(t), "c-ab", last)
	if err != nil || rc.Target != last {
		t.Fatalf("recall: %+v %v", rc, err)
	}
	c, _ = b1.Convs(ctx(t), 0, "")
	if c.Items[0].Unread != 1 {
		t.Fatalf("unread after recall: %+v", c.Items[0])
	}
	if _, err := b1.Recall(ctx(t), "c-ab", 3); wire.CodeOf(err) != wire.NotSender {
		t.Fatalf("recall by another: %v", err)
	}
	again, err := ca.Recall(ctx(t), "c-ab", last)
	if err != nil || again.Seq != rc.Seq {
		t.Fatalf("recall again: %+v %v", again, err)
	}
}

func TestSmokeSnapshot(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	cfg.SnapshotFullMax, cfg.SnapshotTail = 10, 3
	env := parleytest.Start(t, cfg)
	ana := env.User(t, "ana", 1)
	env.User(t, "ben", 1)
	env.Group(t, "g1", "ana", "ben")
	env.Group(t, "g2", "ana", "ben")
	env.User(t, "cy", 1)
	env.Group(t, "g3", "ben", "cy")
	ca, _ := dial(t, env, ana[0])
	for i := 0; i < 20; i++ {
		if _, err := ca.Send(ctx(t), "g1", fmt.Sprint(i), []byte("m")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ca.Send(ctx(t), "g2", "x", []byte("m")); err != nil {
		t.Fatal(err)
	}
	r, err := ca.Snapshot(ctx(t), []wire.ConvAfter{{Conv: "g1", After: 0}, {Conv: "g2", After: 0}, {Conv: "g3", After: 0}, {Conv: "g2", After: 2}, {Conv: "g2", After: 9}})
	if err != nil {
		t.Fatal(err)
	}
	it := r.Items
	if len(it) != 5 {
		t.Fatalf("items: %+v", it)
	}
	if it[0].Head != 21 || len(it[0].Events) != 3 || it[0].Skipped != 18 || it[0].Events[2].Seq != 21 {
		t.Fatalf("tail item: %+v", it[0])
	}
	if len(it[1].Events) != 2 || it[1].Skipped != 0 {
		t.Fatalf("full item: %+v", it[1])
	}
	if it[2].Error != "NOT_MEMBER" || it[3].Error != "" || len(it[3].Events) != 0 || it[4].Error != "CURSOR_AHEAD" {
		t.Fatalf("items: %+v", it[2:])
	}
}

// TestRedeliveryScanHintsUnackedDevice: a device that got pushes but did
// not ack them gets a hint after redelivery_delay; once it acks, no more.
func TestRedeliveryScanHintsUnackedDevice(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	cfg.RedeliveryDelay = 300 * time.Millisecond
	env := parleytest.Start(t, cfg)
	ana := env.User(t, "ana", 1)
	ben := env.User(t, "ben", 1)
	env.Group(t, "g", "ana", "ben")
	ca, _ := dial(t, env, ana[0])
	cb, fb := dial(t, env, ben[0])
	r, err := ca.Send(ctx(t), "g", "1", []byte("m"))
	if err != nil {
		t.Fatal(err)
	}
	waitPush(t, fb, "g", r.Seq)
	deadline := time.After(3 * time.Second)
	for hinted := false; !hinted; {
		select {
		case m := <-fb:
			hinted = m.T == wire.THint && m.Conv == "g" && m.Head == r.Seq
		case <-deadline:
			t.Fatal("no hint for an unacked push")
		}
	}
	if _, err := cb.Ack(ctx(t), "g", r.Seq); err != nil {
		t.Fatal(err)
	}
	for len(fb) > 0 {
		<-fb
	}
	select {
	case m := <-fb:
		if m.T == wire.THint {
			t.Fatalf("hint after ack: %+v", m)
		}
	case <-time.After(time.Second):
	}
}
