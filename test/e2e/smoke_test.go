package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/wire"
)

// dial connects dev and collects its server frames.
func dial(t *testing.T, env *parleytest.Env, dev parleytest.Device) (*client.Conn, chan wire.Message) {
	t.Helper()
	frames := make(chan wire.Message, 1024)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, env.Addr, dev.ID, dev.Token, client.DialOptions{OnServerFrame: func(m wire.Message) {
		select {
		case frames <- m:
		default:
		}
	}})
	if err != nil {
		t.Fatalf("dial %s: %v", dev.ID, err)
	}
	t.Cleanup(func() { c.Close() })
	return c, frames
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// mustSend has c send body to conv as cmid and returns the send_ok; a
// refused send fails the test.
func mustSend(t *testing.T, c *client.Conn, conv, cmid string, body []byte) wire.Message {
	t.Helper()
	m, err := c.Send(ctx(t), conv, cmid, body)
	if err != nil {
		t.Fatalf("send %s/%s: %v", conv, cmid, err)
	}
	return m
}

func waitPush(t *testing.T, frames chan wire.Message, conv string, seq int64) wire.Message {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case m := <-frames:
			if m.T == wire.TPush && m.Conv == conv && m.Seq == seq {
				return m
			}
		case <-deadline:
			t.Fatalf("no push of %s/%d", conv, seq)
		}
	}
}

func TestSmokeSendPushSyncAck(t *testing.T) {
	t.Parallel()
	env := parleytest.Start(t, parleytest.Config(t))
	ana := env.User(t, "ana", 1)
	ben := env.User(t, "ben", 2)
	env.Group(t, "c-ab", "ana", "ben")

	ca, _ := dial(t, env, ana[0])
	cb1, f1 := dial(t, env, ben[0])
	_, f2 := dial(t, env, ben[1])
	ok, err := ca.Send(ctx(t), "c-ab", "m1", []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	if ok.Seq != 2 {
		t.Fatalf("seq = %d, want 2 (1 is the join)", ok.Seq)
	}
	p := waitPush(t, f1, "c-ab", 2)
	if string(p.Body) != "hello" || p.Sender != "ana" || p.Kind != "msg" {
		t.Fatalf("push = %+v", p)
	}
	waitPush(t, f2, "c-ab", 2)
	s, err := cb1.Sync(ctx(t), "c-ab", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.Head != 2 || s.Upto != 2 || s.More || len(s.Events) != 2 || s.Events[0].Kind != "join" {
		t.Fatalf("sync = %+v", s)
	}
	a, err := cb1.Ack(ctx(t), "c-ab", 2)
	if err != nil || a.Delivered != 2 {
		t.Fatalf("ack = %+v, %v", a, err)
	}
	if _, err := cb1.Ack(ctx(t), "c-ab", 99); wire.CodeOf(err) != wire.CursorAhead {
		t.Fatalf("ack ahead: %v", err)
	}
	dup, err := ca.Send(ctx(t), "c-ab", "m1", []byte("hello"))
	if err != nil || !dup.Dup || dup.Seq != 2 {
		t.Fatalf("dup send = %+v, %v", dup, err)
	}
	// ana's first send looked her membership up; the second was answered
	// from the cache (a background refresh may have counted one more).
	if n := env.Srv.MetricSum("parley_membership_lookups_total"); n < 1 || n > 2 {
		t.Fatalf("parley_membership_lookups_total = %v, want 1 (or 2 with a refresh)", n)
	}
}
