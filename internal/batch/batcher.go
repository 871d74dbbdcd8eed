package batch

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/backend"
)

// ErrClosed answers a Submit after Close (a shutdown: the caller's
// request was not run; it is a backend.ErrUnavailable).
var ErrClosed = fmt.Errorf("batch: closed: %w", backend.ErrUnavailable)

// Config sizes a Batcher.
type Config struct {
	// Workers is how many batches may run at once; half as many again
	// run when the batches are full (a backlog).
	Workers int
	// Max is the most requests in one batch.
	Max int
	// Queue is how many requests may wait; Submit blocks beyond it
	// (backpressure).
	Queue int
	// Linger is how long the former waits for more requests when under
	// load (the previous batch had more than one) before it closes a
	// batch that is not full: a little latency buys bigger batches, hence
	// fewer commits and less contention on PostgreSQL's WAL. Not under
	// load, a lone request runs at once.
	Linger time.Duration
	// Timeout is the deadline of a request whose context has none.
	Timeout time.Duration
	// Sizes, if not nil, observes the size of every batch, and Waits how
	// long each request waited, in seconds, from Submit until a worker
	// started its batch, less the time its batch spent in prepare.
	Sizes, Waits Observer
}

// Batcher runs batches of requests submitted by many goroutines: at most
// Workers batches at once, or half as many again when the batches are
// full.
//
// All workers take from one queue, so no request waits behind a busy
// worker while another is idle. One goroutine forms the batches, in
// submit order, and prepares each (seq allocation) while the workers run
// earlier ones; it holds at most one prepared batch until a worker is
// free, so preparing never keeps a worker idle. Under moderate load, few
// transactions in flight make bigger batches (fewer commits, less CPU,
// lower latency); under a backlog, more in flight raise the peak
// (BENCHMARKS.md, the row "at 54580f0" on `direct` at 30,000 sends/s).
type Batcher[Q, R any] struct {
	// Static after construction.
	cfg     Config
	prepare func(context.Context, []Q) // nil: none
	run     Run[Q, R]
	ch      chan entry[Q, R]
	ready   chan formed[Q, R] // formed (and prepared) batches, to the workers
	partial chan struct{}     // a token per running batch that is not full

	mu     sync.RWMutex // guards closed; held shared by Submit while sending on ch
	closed bool
	wg     sync.WaitGroup
}

// entry is a queued request.
type entry[Q, R any] struct {
	q        Q
	done     func(R, error)
	deadline time.Time
	at       time.Time // when it was submitted (if waits are observed)
}

// formed is a batch ready to run.
type formed[Q, R any] struct {
	qs       []Q
	dones    []func(R, error)
	deadline time.Time     // the latest of its requests'
	ats      []time.Time   // when each request was submitted (if waits are observed)
	prepared time.Duration // how long prepare took
	token    bool          // holds a partial token
}

// New starts the batch former and Workers + Workers/2 goroutines to run
// batches (Workers/2 only for full ones).
//
// prepare, if not nil, runs on each batch right after it is formed and
// before the next one is formed: requests are prepared in the order they
// were submitted, one batch at a time. run then runs the batches
// concurrently, in any order. Both get a context with the batch's
// deadline.
func New[Q, R any](cfg Config, prepare func(context.Context, []Q), run Run[Q, R]) *Batcher[Q, R] {
	b := &Batcher[Q, R]{cfg: cfg, prepare: prepare, run: run,
		ch: make(chan entry[Q, R], cfg.Queue), ready: make(chan formed[Q, R]), partial: make(chan struct{}, cfg.Workers)}
	extra := cfg.Workers / 2 // none for one worker: Sharded relies on that
	b.wg.Add(cfg.Workers + extra + 1)
	go b.form()
	for i := 0; i < cfg.Workers+extra; i++ {
		go b.work()
	}
	return b
}

// Submit queues q; done is called exactly once, with q's answer or the
// error that kept it from one. Submit blocks while the queue is full
// (backpressure) or until ctx is done; a request whose ctx is done is not
// queued, and done gets ctx's error (or ErrClosed after Close) before
// Submit returns, outside the batcher's lock (done may submit again).
func (b *Batcher[Q, R]) Submit(ctx context.Context, q Q, done func(R, error)) {
	if err := b.enqueue(ctx, q, done); err != nil {
		var zero R
		done(zero, err)
	}
}

// enqueue queues q, or returns why it did not.
func (b *Batcher[Q, R]) enqueue(ctx context.Context, q Q, done func(R, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ErrClosed
	}
	now := time.Now()
	e := entry[Q, R]{q: q, done: done, deadline: deadlineOf(ctx, now, b.cfg.Timeout)}
	if b.cfg.Waits != nil {
		e.at = now
	}
	select {
	case b.ch <- e:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops accepting requests, runs every queued one and waits for the
// workers. Safe to call twice.
func (b *Batcher[Q, R]) Close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.ch)
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// work runs formed batches until the former is done.
func (b *Batcher[Q, R]) work() {
	defer b.wg.Done()
	for f := range b.ready {
		if b.cfg.Waits != nil {
			now := time.Now()
			for _, at := range f.ats {
				b.cfg.Waits.Observe((now.Sub(at) - f.prepared).Seconds())
			}
		}
		ctx, cancel := context.WithDeadline(context.Background(), f.deadline)
		rs, err := b.run(ctx, f.qs)
		cancel()
		answer(len(f.qs), rs, err, func(i int, r R, err error) { f.dones[i](r, err) })
		if f.token {
			<-b.partial
		}
	}
}

// add puts e into f.
func (f *formed[Q, R]) add(e entry[Q, R], observeWaits bool) {
	f.qs = append(f.qs, e.q)
	f.dones = append(f.dones, e.done)
	if e.deadline.After(f.deadline) {
		f.deadline = e.deadline
	}
	if observeWaits {
		f.ats = append(f.ats, e.at)
	}
}

// form forms batches until the queue is closed and drained.
func (b *Batcher[Q, R]) form() {
	defer b.wg.Done()
	defer close(b.ready)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	observeWaits := b.cfg.Waits != nil
	busy := false // the previous batch had more than one request
	for first := range b.ch {
		f := formed[Q, R]{qs: make([]Q, 0, b.cfg.Max), dones: make([]func(R, error), 0, b.cfg.Max)}
		f.add(first, observeWaits)
		var deadline <-chan time.Time
		if busy && b.cfg.Linger > 0 {
			timer.Reset(b.cfg.Linger)
			deadline = timer.C
		}
	fill:
		for len(f.qs) < b.cfg.Max {
			var e entry[Q, R]
			var ok bool
			select {
			case e, ok = <-b.ch:
			default:
				if deadline == nil {
					break fill
				}
				select {
				case e, ok = <-b.ch:
				case <-deadline:
					deadline = nil
					break fill
				}
			}
			if !ok {
				break
			}
			f.add(e, observeWaits)
		}
		timer.Stop() // Go 1.23+: no stale tick can be received after Stop
		busy = len(f.qs) > 1
		if b.cfg.Sizes != nil {
			b.cfg.Sizes.Observe(float64(len(f.qs)))
		}
		if b.prepare != nil {
			start := time.Now()
			ctx, cancel := context.WithDeadline(context.Background(), f.deadline)
			b.prepare(ctx, f.qs)
			cancel()
			f.prepared = time.Since(start)
		}
		if len(f.qs) < b.cfg.Max {
			b.partial <- struct{}{}
			f.token = true
		}
		b.ready <- f
	}
}

// Sharded is a set of one-worker Batchers: Submit picks one by key, so
// requests with the same key (one connection's acks) run one batch at a
// time, in the order they were submitted.
type Sharded[Q, R any] struct {
	shards []*Batcher[Q, R]
}

// NewSharded starts cfg.Workers one-worker Batchers; cfg.Queue is shared
// out among them. See New for the rest.
func NewSharded[Q, R any](cfg Config, run Run[Q, R]) *Sharded[Q, R] {
	s := &Sharded[Q, R]{}
	one := cfg
	one.Workers, one.Queue = 1, cfg.Queue/cfg.Workers+1
	for i := 0; i < cfg.Workers; i++ {
		s.shards = append(s.shards, New(one, nil, run))
	}
	return s
}

// Submit queues q on the shard of key (see Batcher.Submit).
func (s *Sharded[Q, R]) Submit(ctx context.Context, key uint64, q Q, done func(R, error)) {
	s.shards[key%uint64(len(s.shards))].Submit(ctx, q, done)
}

// Close closes every shard (see Batcher.Close).
func (s *Sharded[Q, R]) Close() {
	for _, b := range s.shards {
		b.Close()
	}
}
