// Package batch groups work items submitted by many goroutines into
// batches run by a fixed number of workers: group commit. A lone item runs
// at once; under load, items that queue up while workers are busy go
// together into the next batch, so one PostgreSQL commit serves many.
//
// All workers take from one queue, so no item waits behind a busy worker
// while another is idle. Batches are formed one at a time, in submit
// order, and an optional prepare step (seq allocation) runs on each batch
// before the next is formed: what prepare hands out follows submit order,
// while the batches themselves then run concurrently.
package batch

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Observer takes one measurement (prometheus.Observer fits).
type Observer interface{ Observe(float64) }

// ObserveSince gives o (if not nil) the seconds since start, and returns
// the time now, for timing consecutive stages.
func ObserveSince(o Observer, start time.Time) time.Time {
	now := time.Now()
	if o != nil {
		o.Observe(now.Sub(start).Seconds())
	}
	return now
}

// ErrClosed is returned by Submit after Close.
var ErrClosed = errors.New("batch: closed")

// Batcher runs run(items) on batches of at most max items, with at most
// workers batches in flight.
type Batcher[T any] struct {
	// Static after construction.
	max     int
	linger  time.Duration
	prepare func([]T) // nil: none
	run     func([]T)
	ch      chan entry[T]
	sizes   Observer // nil: not observed
	waits   Observer // nil: not observed

	// form is held by the worker forming (and preparing) the next batch:
	// batches are formed one at a time, in submit order.
	form sync.Mutex
	busy bool // guarded by form: the previous batch had more than one item

	mu     sync.RWMutex // guards closed; held shared by Submit while sending on ch
	closed bool
	wg     sync.WaitGroup
}

// New starts workers goroutines. queue is how many items may wait.
//
// linger is how long the worker forming a batch waits for more items when
// under load (the previous batch had more than one item) before running a
// batch that is not full: a little latency buys bigger batches, hence
// fewer commits and less contention on PostgreSQL's WAL. Not under load,
// a lone item runs at once.
//
// prepare, if not nil, runs on each batch right after it is formed and
// before the next one is: items are prepared in the order they were
// submitted, one batch at a time. run then runs the batches concurrently.
//
// sizes, if not nil, observes the size of every batch, and waits how long
// each item waited, in seconds, from Submit to the start of its batch
// (metrics).
func New[T any](workers, max, queue int, linger time.Duration, prepare, run func([]T), sizes, waits Observer) *Batcher[T] {
	b := &Batcher[T]{max: max, linger: linger, prepare: prepare, run: run, sizes: sizes, waits: waits,
		ch: make(chan entry[T], queue)}
	b.wg.Add(workers)
	for i := 0; i < workers; i++ {
		go b.work()
	}
	return b
}

// Submit queues item. It blocks while the queue is full (backpressure) or
// until ctx is done.
func (b *Batcher[T]) Submit(ctx context.Context, item T) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ErrClosed
	}
	e := entry[T]{item: item}
	if b.waits != nil {
		e.at = time.Now()
	}
	select {
	case b.ch <- e:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops accepting items, runs every queued one and waits for the
// workers. Safe to call twice.
func (b *Batcher[T]) Close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.ch)
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// entry is a queued item and when it was submitted (if waits are
// observed).
type entry[T any] struct {
	item T
	at   time.Time
}

func (b *Batcher[T]) work() {
	defer b.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		items, ok := b.next(timer)
		if !ok {
			return
		}
		b.run(items)
	}
}

// next forms the next batch (and prepares it) under b.form; false once
// the queue is closed and drained.
func (b *Batcher[T]) next(timer *time.Timer) ([]T, bool) {
	b.form.Lock()
	defer b.form.Unlock()
	first, ok := <-b.ch
	if !ok {
		return nil, false
	}
	items := make([]T, 1, b.max)
	items[0] = first.item
	var ats []time.Time
	if b.waits != nil {
		ats = append(ats, first.at)
	}
	var deadline <-chan time.Time
	if b.busy && b.linger > 0 {
		timer.Reset(b.linger)
		deadline = timer.C
	}
fill:
	for len(items) < b.max {
		var it entry[T]
		select {
		case it, ok = <-b.ch:
		default:
			if deadline == nil {
				break fill
			}
			select {
			case it, ok = <-b.ch:
			case <-deadline:
				deadline = nil
				break fill
			}
		}
		if !ok {
			break
		}
		items = append(items, it.item)
		if b.waits != nil {
			ats = append(ats, it.at)
		}
	}
	timer.Stop() // Go 1.23+: no stale tick can be received after Stop
	b.busy = len(items) > 1
	if b.sizes != nil {
		b.sizes.Observe(float64(len(items)))
	}
	if b.waits != nil {
		now := time.Now()
		for _, at := range ats {
			b.waits.Observe(now.Sub(at).Seconds())
		}
	}
	if b.prepare != nil {
		b.prepare(items)
	}
	return items, true
}

// Sharded is a set of one-worker Batchers: Submit picks one by key, so
// items with the same key (one connection's acks) run one batch at a time,
// in the order they were submitted.
type Sharded[T any] struct {
	shards []*Batcher[T]
}

// NewSharded starts workers one-worker Batchers; queue is shared out
// among them. See New for the rest.
func NewSharded[T any](workers, max, queue int, linger time.Duration, run func([]T), sizes, waits Observer) *Sharded[T] {
	s := &Sharded[T]{}
	for i := 0; i < workers; i++ {
		s.shards = append(s.shards, New(1, max, queue/workers+1, linger, nil, run, sizes, waits))
	}
	return s
}

// Submit queues item on the shard of key (see Batcher.Submit).
func (s *Sharded[T]) Submit(ctx context.Context, key uint64, item T) error {
	return s.shards[key%uint64(len(s.shards))].Submit(ctx, item)
}

// Close closes every shard (see Batcher.Close).
func (s *Sharded[T]) Close() {
	for _, b := range s.shards {
		b.Close()
	}
}
