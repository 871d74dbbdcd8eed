package store_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/parley-im/parley/seq"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/test/parleytest"
)

// BenchmarkEditIdleInTransaction measures what an edit's transaction
// holds across its seq allocation (docs/consistency.md, "Edits and the
// seq allocation"): idle-µs is the Redis allocation itself, while the
// transaction is open and idle with the change lock (shared) and the
// message's row lock; held-µs runs from the allocation's start to the
// edit's return (the write, the COMMIT and its WAL flush included).
// alone: edits one after another; with-sends: as many editors as
// parallel goroutines (8 on 2 cores), each on its own conversation's
// message, while 8 senders commit 20-message batches to those
// conversations, seqs allocated from the same Redis counters.
//
//	go test -run '^$' -bench EditIdleInTransaction -benchtime 3000x ./store/
func BenchmarkEditIdleInTransaction(b *testing.B) {
	env := newStoreFix(b, 32, time.Hour) // users ana, ben and cy
	ctx, st := env.ctx, env.st
	seqs := seq.New(parleytest.RedisClient(b, env.cfg), env.cfg.RedisPrefix+"bench:", st.Heads)
	const convs = 8
	target := map[string]int64{}
	for i := range convs {
		c := fmt.Sprint("g", i)
		env.Group(b, c, "ana", "ben")
		s, err := seqs.AllocOne(ctx, c)
		if err != nil {
			b.Fatal(err)
		}
		if res, err := st.InsertMessages(ctx, []store.NewMessage{{Conv: c, Sender: "ana", Cmid: "target", Body: []byte("m"), Seq: s, Ts: time.Now().UnixMilli()}}, 100); err != nil || res[0].Err != nil {
			b.Fatal(err, res)
		}
		target[c] = s
	}
	var n atomic.Int64 // distinct bodies: a repeated one is a retry
	run := func(b *testing.B, editors func(func(conv string)), senders int) {
		idle := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
		held := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
		var mu sync.Mutex
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var sent atomic.Int64
		for s := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := fmt.Sprint("g", s%convs)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					first, err := seqs.Alloc(ctx, []string{c}, []int64{20})
					if err != nil {
						b.Error(err)
						return
					}
					msgs := make([]store.NewMessage, 20)
					for k := range msgs {
						msgs[k] = store.NewMessage{Conv: c, Sender: "ben", Cmid: fmt.Sprint(s, "-", i, "-", k), Body: make([]byte, 100),
							Seq: first[0] + int64(k), Ts: time.Now().UnixMilli()}
					}
					if _, err := st.InsertMessages(ctx, msgs, 100); err != nil {
						b.Error(err)
						return
					}
					sent.Add(20)
				}
			}()
		}
		start := time.Now()
		b.ResetTimer()
		editors(func(c string) {
			var a0, a1 time.Time
			ch := &store.MembershipChange{Conv: c, Actor: "ana", Ts: time.Now().UnixMilli(), Alloc: func(ctx context.Context) (int64, error) {
				a0 = time.Now()
				s, err := seqs.AllocOne(ctx, c)
				a1 = time.Now()
				return s, err
			}}
			if _, err := st.Edit(ctx, ch, target[c], []byte(fmt.Sprint("edit ", n.Add(1))), 1<<40); err != nil {
				b.Error(err)
				return
			}
			done := time.Now()
			mu.Lock()
			_ = idle.RecordValue(a1.Sub(a0).Microseconds())
			_ = held.RecordValue(done.Sub(a0).Microseconds())
			mu.Unlock()
		})
		b.StopTimer()
		elapsed := time.Since(start)
		close(stop)
		wg.Wait()
		b.ReportMetric(float64(idle.ValueAtQuantile(50)), "idle-µs-p50")
		b.ReportMetric(float64(idle.ValueAtQuantile(99)), "idle-µs-p99")
		b.ReportMetric(float64(idle.Max()), "idle-µs-max")
		b.ReportMetric(float64(held.ValueAtQuantile(50)), "held-µs-p50")
		b.ReportMetric(float64(held.ValueAtQuantile(99)), "held-µs-p99")
		b.ReportMetric(float64(sent.Load())/elapsed.Seconds(), "sends/s")
	}
	b.Run("alone", func(b *testing.B) {
		run(b, func(edit func(string)) {
			for i := range b.N {
				edit(fmt.Sprint("g", i%convs))
			}
		}, 0)
	})
	b.Run("with-sends", func(b *testing.B) {
		var next atomic.Int64
		b.SetParallelism(4)
		run(b, func(edit func(string)) {
			b.RunParallel(func(pb *testing.PB) {
				c := fmt.Sprint("g", next.Add(1)%convs)
				for pb.Next() {
					edit(c)
				}
			})
		}, 8)
	})
}
