package e2e_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/wire"
)

// TestSeqAllocFailsPerConversation: when one conversation's seq counter
// cannot be incremented (here: its key holds the wrong type), its sends
// fail while sends to other conversations, committed in the same batches,
// go on and leave no holes; once the counter is usable again the
// conversation goes on too. A key of the wrong type is not an outage, so
// the failed sends are INTERNAL (and logged), not UNAVAILABLE.
func TestSeqAllocFailsPerConversation(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	env := parleytest.Start(t, cfg)
	rdb := parleytest.RedisClient(t, env.Cfg)
	ana := env.User(t, "ana", 1)
	env.User(t, "ben", 1)
	env.Group(t, "g-ok", "ana", "ben")
	env.Group(t, "g-bad", "ana", "ben")
	ctx := context.Background()
	badKey := env.Cfg.RedisPrefix + "seq:{g-bad}"
	if err := rdb.Del(ctx, badKey).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, badKey, "not", "a counter").Err(); err != nil {
		t.Fatal(err)
	}
	c, _ := dial(t, env, ana[0])
	// One connection, so both conversations' sends share commit batches.
	var wg sync.WaitGroup
	var mu sync.Mutex
	okSeqs := map[int64]bool{}
	badCodes := map[wire.Code]int{}
	for i := 0; i < 40; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			r, err := c.Send(ctx, "g-ok", fmt.Sprint("ok", i), []byte("m"))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("send to the healthy conversation: %v", err)
				return
			}
			okSeqs[r.Seq] = true
		}()
		go func() {
			defer wg.Done()
			_, err := c.Send(ctx, "g-bad", fmt.Sprint("bad", i), []byte("m"))
			mu.Lock()
			badCodes[wire.CodeOf(err)]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if badCodes[wire.Internal] != 40 {
		t.Fatalf("sends to the broken conversation: %v, want 40 INTERNAL", badCodes)
	}
	// The healthy conversation: seqs 2..41 (1 is the join), no holes.
	p, err := c.Sync(ctx, "g-ok", 1, 100)
	if err != nil || p.Head != 41 || p.Upto != 41 || len(p.Events) != 40 || len(okSeqs) != 40 {
		t.Fatalf("healthy conversation after the batch: head %d upto %d, %d events, %d seqs, %v", p.Head, p.Upto, len(p.Events), len(okSeqs), err)
	}
	// The counter is usable again: re-seeded from PostgreSQL, no seq reused.
	if err := rdb.Del(ctx, badKey).Err(); err != nil {
		t.Fatal(err)
	}
	r, err := c.Send(ctx, "g-bad", "after", []byte("m"))
	if err != nil || r.Seq != 2 {
		t.Fatalf("send after the counter came back: %+v %v", r, err)
	}
}

// TestSeqReseedsManyAtOnce: counters lost for many conversations at once
// (Redis lost its data) are re-seeded together, in the batches their next
// sends share, and every conversation continues right above its highest
// committed seq.
func TestSeqReseedsManyAtOnce(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	env := parleytest.Start(t, cfg)
	rdb := parleytest.RedisClient(t, env.Cfg)
	ana := env.User(t, "ana", 1)
	env.User(t, "ben", 1)
	const n = 30
	convs := make([]string, n)
	for i := range convs {
		convs[i] = fmt.Sprint("g", i)
		env.Group(t, convs[i], "ana", "ben") // seq 1
	}
	c, _ := dial(t, env, ana[0])
	ctx := context.Background()
	sendAll := func(round int) map[string]int64 {
		var wg sync.WaitGroup
		var mu sync.Mutex
		seqs := map[string]int64{}
		for _, conv := range convs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := c.Send(ctx, conv, fmt.Sprint(conv, "-", round), []byte("m"))
				if err != nil {
					t.Errorf("send to %s: %v", conv, err)
					return
				}
				mu.Lock()
				seqs[conv] = r.Seq
				mu.Unlock()
			}()
		}
		wg.Wait()
		return seqs
	}
	sendAll(0) // seq 2 everywhere
	for round, want := range []int64{3, 4} {
		if round == 0 {
			keys := make([]string, n)
			for i, conv := range convs {
				keys[i] = env.Cfg.RedisPrefix + "seq:{" + conv + "}"
			}
			for _, k := range keys {
				if err := rdb.Del(ctx, k).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
		for conv, seq := range sendAll(round + 1) {
			if seq != want {
				t.Errorf("round %d: %s got seq %d, want %d (right above the highest committed)", round+1, conv, seq, want)
			}
		}
	}
}
