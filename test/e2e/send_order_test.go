package e2e_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/wire"
)

// TestPipelinedSendsGetSeqsInSendOrder: a device that sends many messages
// without waiting for send_ok gets increasing seqs in the order it sent
// them, while other devices keep the commit workers busy (so batches form
// and commit concurrently, and may commit out of order).
func TestPipelinedSendsGetSeqsInSendOrder(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	env := parleytest.Start(t, cfg)
	users, devs := env.Users(t, "po%02d", 10)
	env.Group(t, "order", users[0], users[1])
	for i := 2; i < len(users); i++ {
		env.Group(t, fmt.Sprintf("busy%d", i), users[i], users[1])
	}

	const n = 200 // below the 256 requests one connection may have queued
	var wg sync.WaitGroup
	for i := 2; i < len(devs); i++ {
		c, _ := dial(t, env, devs[i])
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < n; k++ {
				if err := c.Write(wire.Request{T: wire.TSend, Rid: fmt.Sprint(k), Conv: fmt.Sprintf("busy%d", i), Cmid: fmt.Sprint(k), Body: []byte("x")}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	c, frames := dial(t, env, devs[0])
	for k := 0; k < n; k++ {
		if err := c.Write(wire.Request{T: wire.TSend, Rid: fmt.Sprintf("o%03d", k), Conv: "order", Cmid: fmt.Sprint(k), Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	seqs := map[string]int64{}
	deadline := time.After(20 * time.Second)
	for len(seqs) < n {
		select {
		case m := <-frames:
			if m.T != wire.TSendOK {
				t.Fatalf("got %+v", m)
			}
			seqs[m.Rid] = m.Seq
		case <-deadline:
			t.Fatalf("%d of %d send_ok", len(seqs), n)
		}
	}
	for k := 1; k < n; k++ {
		a, b := seqs[fmt.Sprintf("o%03d", k-1)], seqs[fmt.Sprintf("o%03d", k)]
		if b <= a {
			t.Fatalf("send %d got seq %d, after send %d got %d: seqs not in send order", k, b, k-1, a)
		}
	}
}
