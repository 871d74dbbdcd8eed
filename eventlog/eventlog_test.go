package eventlog_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/internal/parleytest"
	"github.com/parley-im/parley/scripts"
	"github.com/parley-im/parley/seq"
	"github.com/parley-im/parley/store"
)

// TestSendFansOutBeforeAnswering: a committed send is handed to fan-out
// before its sender is answered. A client that sends its next message on
// send_ok would otherwise race its own messages through fan-out, and
// members could be pushed them out of order.
func TestSendFansOutBeforeAnswering(t *testing.T) {
	env := parleytest.Start(t, parleytest.Config(t))
	env.User(t, "ana", 1)
	env.Group(t, "g", "ana")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := store.Open(ctx, env.Cfg.PostgresURL, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rdb := parleytest.RedisClient(t, env.Cfg)
	if err := scripts.Load(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	fanned := map[int64]bool{}
	l := eventlog.New(st, seq.New(rdb, env.Cfg.RedisPrefix, st.Head),
		eventlog.Config{HoleTimeout: time.Second, CommitBatch: 16, CommitWorkers: 4, CommitLinger: time.Millisecond},
		slog.New(slog.DiscardHandler), func(evs []eventlog.Committed) {
			mu.Lock()
			for _, e := range evs {
				fanned[e.Seq] = true
			}
			mu.Unlock()
		})
	defer l.Close()
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		l.Send(ctx, eventlog.Message{Conv: "g", Sender: "ana", Cmid: fmt.Sprint(i), Body: []byte("m")}, func(r eventlog.SendResult) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case r.Err != nil:
				errs <- r.Err
			case !fanned[r.Seq]:
				errs <- fmt.Errorf("seq %d answered before it was handed to fan-out", r.Seq)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
