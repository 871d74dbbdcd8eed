package batch

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/backend"
)

// A Combiner answers the same kind of request for many callers with one
// statement. After a reconnect storm thousands of devices authenticate and
// ask for a snapshot at once, most of them about the same few
// conversations as other members of those conversations. While Workers
// statements are running, the requests that arrive queue up and go into
// the next statement together, up to Max weight: one round trip for all
// of them, and what they have in common read once (see
// store.SnapshotBatch). A lone request runs at once.
//
// Combining never serves stale data: a request only ever joins a
// statement that starts after it arrived (never one already running), so
// its answer is as fresh as if it had run alone; and each request still
// gets its own answer (a snapshot's periods, read position, unread count
// and visible events stay per user).
type Combiner[Q, R any] struct {
	// Set before the first Do, then never changed.
	Workers int
	Max     int           // most weight in one batch (a lone request may exceed it)
	Weight  func(q Q) int // nil: 1 per request
	Run     Run[Q, R]
	Sizes   Observer      // nil: batch sizes not observed
	Timeout time.Duration // the deadline of a request whose context has none
	Log     *slog.Logger  // nil: slog.Default()
	// Go starts a worker (nil: a plain goroutine); the gateway tracks
	// them, so that a shutdown waits for their statements.
	Go func(func())

	mu      sync.Mutex
	queue   []*combined[Q, R] // guarded by mu
	running int               // workers running; guarded by mu
	waited  time.Time         // see Waited; guarded by mu
}

type combined[Q, R any] struct {
	ctx      context.Context
	deadline time.Time
	q        Q
	r        R // set before done is closed
	err      error
	done     chan struct{}
}

// Do answers q, in a batch with whatever else is waiting.
func (b *Combiner[Q, R]) Do(ctx context.Context, q Q) (R, error) {
	c := &combined[Q, R]{ctx: ctx, deadline: deadlineOf(ctx, time.Now(), b.Timeout), q: q, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	start := b.running < b.Workers
	if start {
		b.running++
	} else {
		b.waited = time.Now()
	}
	b.mu.Unlock()
	if start {
		if b.Go != nil {
			b.Go(b.work)
		} else {
			go b.work()
		}
	}
	select {
	case <-c.done:
		return c.r, c.err
	case <-ctx.Done():
		var zero R
		return zero, ctx.Err() // it is dropped from the queue when its turn comes
	}
}

// Waited returns when a request last arrived while every worker was
// busy, so that it had to wait for a batch (zero if none has): a backlog
// of requests, as in a reconnect storm.
func (b *Combiner[Q, R]) Waited() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waited
}

// work runs batches until the queue is empty.
func (b *Combiner[Q, R]) work() {
	for {
		batch := b.take()
		if batch == nil {
			return
		}
		b.runBatch(batch)
	}
}

// take removes the next batch from the queue: at least one request, and
// more while they fit in max. Requests whose caller gave up are dropped.
// nil: the queue is empty and the worker ends.
func (b *Combiner[Q, R]) take() []*combined[Q, R] {
	b.mu.Lock()
	defer b.mu.Unlock()
	var batch []*combined[Q, R]
	n, weight := 0, 0
	for ; n < len(b.queue); n++ {
		c := b.queue[n]
		if c.ctx.Err() != nil {
			continue
		}
		w := 1
		if b.Weight != nil {
			w = b.Weight(c.q)
		}
		if len(batch) > 0 && weight+w > b.Max {
			break
		}
		batch = append(batch, c)
		weight += w
	}
	clear(b.queue[:n])
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil
	}
	if batch == nil {
		b.running--
	}
	return batch
}

// runBatch runs one statement for batch, under the latest of its
// requests' deadlines.
func (b *Combiner[Q, R]) runBatch(batch []*combined[Q, R]) {
	if b.Sizes != nil {
		b.Sizes.Observe(float64(len(batch)))
	}
	deadline := batch[0].deadline
	qs := make([]Q, len(batch))
	for i, c := range batch {
		qs[i] = c.q
		if c.deadline.After(deadline) {
			deadline = c.deadline
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	rs, err := b.Run(ctx, qs)
	if err != nil && len(batch) > 1 && !backend.IsUnavailable(err) {
		// Not a backend outage: run each request alone, so whatever made
		// the statement fail fails only its own request.
		log := b.Log
		if log == nil {
			log = slog.Default()
		}
		log.Warn("combined read failed; running its requests one by one", "requests", len(batch), "err", err)
		for _, c := range batch {
			one, err := b.Run(ctx, []Q{c.q})
			answer(1, one, err, func(_ int, r R, err error) { c.finish(r, err) })
		}
		return
	}
	answer(len(batch), rs, err, func(i int, r R, err error) { batch[i].finish(r, err) })
}

func (c *combined[Q, R]) finish(r R, err error) {
	c.r, c.err = r, err
	close(c.done)
}
