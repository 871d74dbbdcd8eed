package conn

import (
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/parley-im/parley/fanout"
	"github.com/parley-im/parley/internal/backend"
	"github.com/parley-im/parley/store"
)

// A combiner answers the same kind of read for many connections with one
// database statement. After a reconnect storm thousands of devices
// authenticate and ask for a snapshot at once, most of them about the
// same few conversations as other members of those conversations. While
// `workers` statements are running, the requests that arrive queue up and
// go into the next statement together, up to `max` weight: one round trip
// for all of them, and what they have in common read once (see
// store.SnapshotBatch). A lone request runs at once. The queue holds at
// most one request per connection (a connection's snapshots and auth run
// one at a time).
//
// Combining never serves stale data: a request only ever joins a
// statement that starts after it arrived (never one already running), so
// its answer is as fresh as if it had run alone; and each request still
// gets its own answer (a snapshot's periods, read position, unread count
// and visible events stay per user).
type combiner[Q, R any] struct {
	// Static after construction.
	g       *Gateway
	workers int
	max     int                                            // most weight in one batch (a lone request may exceed it)
	weight  func(q Q) int                                  // nil: 1 per request
	run     func(ctx context.Context, qs []Q) ([]R, error) // one result per request, in order
	sizes   prometheus.Observer

	mu      sync.Mutex
	queue   []*combined[Q, R] // guarded by mu
	running int               // workers running; guarded by mu
}

type combined[Q, R any] struct {
	ctx  context.Context
	q    Q
	r    R // set before done is closed
	err  error
	done chan struct{}
}

// do answers q, in a batch with whatever else is waiting.
func (b *combiner[Q, R]) do(ctx context.Context, q Q) (R, error) {
	c := &combined[Q, R]{ctx: ctx, q: q, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	start := b.running < b.workers
	if start {
		b.running++
	}
	b.mu.Unlock()
	if start {
		b.g.goroutine(b.work)
	}
	select {
	case <-c.done:
		return c.r, c.err
	case <-ctx.Done():
		var zero R
		return zero, ctx.Err() // it is dropped from the queue when its turn comes
	}
}

// work runs batches until the queue is empty.
func (b *combiner[Q, R]) work() {
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
func (b *combiner[Q, R]) take() []*combined[Q, R] {
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
		if b.weight != nil {
			w = b.weight(c.q)
		}
		if len(batch) > 0 && weight+w > b.max {
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

func (b *combiner[Q, R]) runBatch(batch []*combined[Q, R]) {
	b.sizes.Observe(float64(len(batch)))
	ctx, cancel := context.WithTimeout(context.Background(), b.g.cfg.RequestTimeout)
	defer cancel()
	qs := make([]Q, len(batch))
	for i, c := range batch {
		qs[i] = c.q
	}
	var zero R
	rs, err := b.run(ctx, qs)
	if err != nil && len(batch) > 1 && !backend.IsUnavailable(err) {
		// Not a backend outage: run each request alone, so whatever made
		// the statement fail fails only its own request.
		b.g.log.Warn("combined read failed; running its requests one by one", "requests", len(batch), "err", err)
		for _, c := range batch {
			one, err := b.run(ctx, []Q{c.q})
			if err != nil {
				c.finish(zero, err)
			} else {
				c.finish(one[0], nil)
			}
		}
		return
	}
	for i, c := range batch {
		if err != nil {
			c.finish(zero, err)
		} else {
			c.finish(rs[i], nil)
		}
	}
}

func (c *combined[Q, R]) finish(r R, err error) {
	c.r, c.err = r, err
	close(c.done)
}

// Combined reads of the gateway.
const (
	// snapshotBatchItems is the most conversations one snapshot statement
	// covers (a lone request of up to maxSnapshot always runs).
	snapshotBatchItems = 2000
	// memberLoadMax is the most conversations one member-list read
	// covers (typing and receipts).
	memberLoadMax = 1000
	// authBatch is the most devices one auth lookup reads.
	authBatch = 256
	// combineWorkers is how many statements of each kind may run at once.
	combineWorkers = 4
	// provisionWorkers is how many provisioning statements (first JWT
	// logins) may run at once: each is a write transaction whose commit
	// waits for the WAL flush, so fewer, bigger batches cost PostgreSQL
	// less than many small ones, and one batch gathers the first logins
	// that arrive while the other commits.
	provisionWorkers = 2
)

// deviceLookup is the answer to one auth's device lookup.
type deviceLookup struct {
	dev   store.Device
	found bool
}

func (g *Gateway) initCombiners() {
	g.snapshots = combiner[store.SnapshotQuery, []store.SnapshotItem]{
		g: g, workers: combineWorkers, max: snapshotBatchItems,
		weight: func(q store.SnapshotQuery) int { return len(q.Convs) },
		run: func(ctx context.Context, qs []store.SnapshotQuery) ([][]store.SnapshotItem, error) {
			return g.deps.Store.SnapshotBatch(ctx, qs, g.cfg.SnapshotFullMax, g.cfg.SnapshotTail)
		},
		sizes: g.metrics.combined.WithLabelValues("snapshot"),
	}
	g.lookups = combiner[string, deviceLookup]{
		g: g, workers: combineWorkers, max: authBatch,
		run: func(ctx context.Context, ids []string) ([]deviceLookup, error) {
			devs, err := g.deps.Store.DevicesByID(ctx, ids)
			if err != nil {
				return nil, err
			}
			byID := make(map[string]store.Device, len(devs))
			for _, d := range devs {
				byID[d.ID] = d
			}
			out := make([]deviceLookup, len(ids))
			for i, id := range ids {
				out[i].dev, out[i].found = byID[id]
			}
			return out, nil
		},
		sizes: g.metrics.combined.WithLabelValues("auth"),
	}
	g.provisions = combiner[store.NewLogin, deviceLookup]{
		g: g, workers: provisionWorkers, max: authBatch,
		run: func(ctx context.Context, ls []store.NewLogin) ([]deviceLookup, error) {
			if err := g.deps.Store.ProvisionDevices(ctx, ls); err != nil {
				return nil, err
			}
			ids := make([]string, len(ls))
			for i, l := range ls {
				ids[i] = l.Device
			}
			devs, err := g.deps.Store.DevicesByID(ctx, ids)
			if err != nil {
				return nil, err
			}
			byID := make(map[string]store.Device, len(devs))
			for _, d := range devs {
				byID[d.ID] = d
			}
			out := make([]deviceLookup, len(ls))
			for i, l := range ls {
				out[i].dev, out[i].found = byID[l.Device]
			}
			return out, nil
		},
		sizes: g.metrics.combined.WithLabelValues("provision"),
	}
	g.members.loads = combiner[string, []string]{
		g: g, workers: combineWorkers, max: memberLoadMax,
		run: func(ctx context.Context, convs []string) ([][]string, error) {
			return g.members.read(ctx, g.deps.Store, convs)
		},
		sizes: g.metrics.combined.WithLabelValues("members"),
	}
	// Each auth joins the online index of its user's big conversations:
	// a statement and a pipeline per batch, not per device (in a
	// reconnect storm, a query each queued behind the snapshot batches
	// for the pool's connections, and auths waited seconds).
	g.onlines = combiner[fanout.OnlineDevice, struct{}]{
		g: g, workers: combineWorkers, max: authBatch,
		run: func(ctx context.Context, devs []fanout.OnlineDevice) ([]struct{}, error) {
			return make([]struct{}, len(devs)), g.deps.Online(ctx, devs)
		},
		sizes: g.metrics.combined.WithLabelValues("online"),
	}
}
