package conn_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/wire"
)

// readsOf is what a device receives on a raw socket: the frames of each
// read system call separately.
type readsOf struct {
	conn   net.Conn
	frames chan []wire.Message // one slice per read
}

// dialCounting authenticates dev on a raw socket and reports, per read,
// the frames that read completed.
func dialCounting(t *testing.T, env *parleytest.Env, dev parleytest.Device) readsOf {
	t.Helper()
	nc, err := net.DialTimeout("tcp", env.Addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if _, err := nc.Write(mustFrame(t, wire.Request{T: wire.TAuth, Rid: "a", Device: dev.ID, Token: dev.Token})); err != nil {
		t.Fatal(err)
	}
	r := readsOf{conn: nc, frames: make(chan []wire.Message, 1024)}
	go func() {
		defer close(r.frames)
		var pending []byte
		buf := make([]byte, 1<<16)
		for {
			n, err := nc.Read(buf)
			if err != nil {
				return
			}
			pending = append(pending, buf[:n]...)
			var got []wire.Message
			for {
				body, used, ferr := wire.NextFrame(pending, 1<<20)
				if ferr != nil || body == nil {
					break
				}
				if m, err := wire.DecodeMessage(body); err == nil {
					got = append(got, m)
				}
				pending = bytes.Clone(pending[used:])
			}
			r.frames <- got
		}
	}()
	return r
}

// pushesIn collects the pushes of conv from seq from on until want
// arrived, and returns how many reads carried them. (Earlier ones, the
// join event, may arrive late: fan-out is asynchronous.)
func (r readsOf) pushesIn(t *testing.T, conv string, from int64, want int, within time.Duration) (seqs []int64, reads int) {
	t.Helper()
	deadline := time.After(within)
	for len(seqs) < want {
		select {
		case ms, ok := <-r.frames:
			if !ok {
				t.Fatalf("connection closed after %d of %d pushes", len(seqs), want)
			}
			counted := false
			for _, m := range ms {
				if m.T == wire.TPush && m.Conv == conv && m.Seq >= from {
					seqs = append(seqs, m.Seq)
					if !counted {
						reads, counted = reads+1, true
					}
				}
			}
		case <-deadline:
			t.Fatalf("%d of %d pushes of %s within %s", len(seqs), want, conv, within)
		}
	}
	return seqs, reads
}

// TestPushCoalesce: with push_coalesce, a big group's pushes to a device
// wait for the gateway's periodic flush and arrive together, in one write,
// in seq order; a small conversation's push is not held back.
func TestPushCoalesce(t *testing.T) {
	const period = 400 * time.Millisecond
	env := startEnv(t, func(c *config.Config) {
		c.WriteFanoutMax = 3 // two members: push tier
		c.OnlineFanoutMax = 3
		c.PushCoalesce = period // four members: pull tier, coalesced
	})
	sender, receiver := newUser(t, env, "cs"), newUser(t, env, "cr")
	others := []string{name("co"), name("co")}
	for _, u := range others {
		env.User(t, u, 1)
	}
	big, small := name("big"), name("small")
	env.Group(t, big, append([]string{sender.User, receiver.User}, others...)...)
	env.Group(t, small, sender.User, receiver.User)

	rd := dialCounting(t, env, receiver)
	for ms := range rd.frames { // auth_ok (and the groups' join pushes)
		if len(ms) > 0 && ms[len(ms)-1].T == wire.TAuthOK {
			break
		}
	}
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sc, err := client.Dial(cctx, env.Addr, sender.ID, sender.Token, client.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()

	// Five messages to the big group, sent one after another.
	const n = 5
	var sent []int64
	for i := 0; i < n; i++ {
		r, err := sc.Send(cctx, big, fmt.Sprint("b", i), []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		sent = append(sent, r.Seq)
	}
	seqs, reads := rd.pushesIn(t, big, sent[0], n, 5*time.Second)
	for i := range sent {
		if seqs[i] != sent[i] {
			t.Fatalf("pushes %v, sent %v", seqs, sent)
		}
	}
	// All five in one flush, or two if the sends straddled a period.
	if reads > 2 {
		t.Fatalf("%d pushes came in %d reads: not coalesced", n, reads)
	}

	// A push-tier message goes out at once, not at the next flush.
	start := time.Now()
	r, err := sc.Send(cctx, small, "s0", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	rd.pushesIn(t, small, r.Seq, 1, 5*time.Second)
	if d := time.Since(start); d > period/2 {
		t.Fatalf("small conversation's push took %s: held for coalescing", d)
	}
}

// TestOneWritePerLoopPass: frames queued for a connection before the
// event loop writes its outbox go out in one write. Twenty pings sent in
// one write are answered by the loop as it reads them; their twenty pongs
// must arrive in one read (with the outbox handed to the loop when the
// first pong was queued, the other nineteen took a second write).
func TestOneWritePerLoopPass(t *testing.T) {
	env := startEnv(t, nil)
	dev := newUser(t, env, "ow")
	rd := dialCounting(t, env, dev)
	for ms := range rd.frames {
		if len(ms) > 0 && ms[len(ms)-1].T == wire.TAuthOK {
			break
		}
	}
	const n = 20
	for round := 0; round < 5; round++ {
		var batch []byte
		for i := 0; i < n; i++ {
			batch = append(batch, mustFrame(t, wire.Request{T: wire.TPing, Rid: fmt.Sprintf("p%d.%d", round, i)})...)
		}
		if _, err := rd.conn.Write(batch); err != nil {
			t.Fatal(err)
		}
		pongs, reads := 0, 0
		deadline := time.After(5 * time.Second)
		for pongs < n {
			select {
			case ms, ok := <-rd.frames:
				if !ok {
					t.Fatal("connection closed")
				}
				reads++
				for _, m := range ms {
					if m.T == wire.TPong {
						pongs++
					}
				}
			case <-deadline:
				t.Fatalf("round %d: %d of %d pongs", round, pongs, n)
			}
		}
		if reads != 1 {
			t.Fatalf("round %d: %d pongs came in %d reads, not one write", round, n, reads)
		}
	}
}
