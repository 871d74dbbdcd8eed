// Package batch groups work items submitted by many goroutines into
// batches run by a fixed number of workers: group commit. A lone item runs
// at once; under load, items that queue up while workers are busy go
// together into the next batch, so one PostgreSQL commit serves many.
//
// Items are sharded over the workers by a key: items with the same key
// (one client connection's requests) go to the same worker and are run in
// the order they were submitted.
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
	max    int
	linger time.Duration
	run    func([]T)
	chs    []chan entry[T] // one per worker
	sizes  Observer        // nil: not observed
	waits  Observer        // nil: not observed

	mu     sync.RWMutex // guards closed; held shared by Submit while sending on ch
	closed bool
	wg     sync.WaitGroup
}

// New starts workers goroutines. queue is how many items may wait.
//
// linger is how long a worker that is under load (its previous batch had
// more than one item) waits for more items before running a batch that is
// not full: a little latency buys bigger batches, hence fewer commits and
// less contention on PostgreSQL's WAL. A worker that is not under load
// runs a lone item at once.
//
// sizes, if not nil, observes the size of every batch, and waits how long
// each item waited, in seconds, from Submit to the start of its batch's
// run (metrics).
func New[T any](workers, max, queue int, linger time.Duration, run func([]T), sizes, waits Observer) *Batcher[T] {
	b := &Batcher[T]{max: max, linger: linger, run: run, sizes: sizes, waits: waits}
	b.wg.Add(workers)
	for i := 0; i < workers; i++ {
		ch := make(chan entry[T], queue/workers+1)
		b.chs = append(b.chs, ch)
		go b.work(ch)
	}
	return b
}

// Submit queues item on the worker of key. It blocks while that queue is
// full (backpressure) or until ctx is done.
func (b *Batcher[T]) Submit(ctx context.Context, key uint64, item T) error {
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
	case b.chs[key%uint64(len(b.chs))] <- e:
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
		for _, ch := range b.chs {
			close(ch)
		}
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

func (b *Batcher[T]) work(ch chan entry[T]) {
	defer b.wg.Done()
	items := make([]T, 0, b.max)
	var ats []time.Time
	busy := false
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for first := range ch {
		items, ats = append(items[:0], first.item), append(ats[:0], first.at)
		var deadline <-chan time.Time
		if busy && b.linger > 0 {
			timer.Reset(b.linger)
			deadline = timer.C
		}
	fill:
		for len(items) < b.max {
			select {
			case it, ok := <-ch:
				if !ok {
					break fill
				}
				items, ats = append(items, it.item), append(ats, it.at)
				continue
			default:
			}
			if deadline == nil {
				break
			}
			select {
			case it, ok := <-ch:
				if !ok {
					break fill
				}
				items, ats = append(items, it.item), append(ats, it.at)
			case <-deadline:
				deadline = nil
				break fill
			}
		}
		timer.Stop() // Go 1.23+: no stale tick can be received after Stop

		busy = len(items) > 1
		if b.sizes != nil {
			b.sizes.Observe(float64(len(items)))
		}
		if b.waits != nil {
			now := time.Now()
			for _, at := range ats {
				b.waits.Observe(now.Sub(at).Seconds())
			}
		}
		b.run(items)
		clear(items)
	}
}
