// Package cursor keeps per-device delivery cursors ("this device holds
// every event of the conversation up to seq") and per-user read positions.
// Both only grow: reports are max-merged, first durably in PostgreSQL
// (GREATEST upserts, group committed, before the reply), then in Redis by
// the hash_max script. The Redis hashes are a hot copy for the tiered
// fan-out to come; nothing reads them yet (convs, read and the redelivery
// scan use PostgreSQL and the gateway's own state). An ack from a
// connection of an older install of the device changes nothing (after a
// reinstall, the old install's acks are refused with STALE_INSTALL).
package cursor

import (
	"context"
	"hash/fnv"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/internal/batch"
	"github.com/parley-im/parley/scripts"
	"github.com/parley-im/parley/store"
)

// Ack is one delivery report.
type Ack = store.CursorUpdate

// Result is the merged cursor, or store.ErrStaleInstall,
// store.ErrNotMember, store.ErrCursorAhead, or a backend error.
type Result = store.CursorResult

// Cursors merges acks.
type Cursors struct {
	// Static after construction.
	st                      *store.Store
	rdb                     redis.UniversalClient
	prefix                  string
	log                     *slog.Logger
	ackMetrics, readMetrics Metrics

	acks  *batch.Sharded[Ack, Result]
	reads *batch.Sharded[store.ReadUpdate, store.ReadResult]
}

// Metrics observe one kind of report (acks or reads): Sizes, the reports
// per commit; Queue, how long each report waited for a commit worker; and
// per batch, how long its PostgreSQL statement and commit (Postgres) and
// its Redis hot copy (Redis) took, in seconds. Nil fields are not observed.
type Metrics struct {
	Sizes, Queue, Postgres, Redis batch.Observer
}

// Config sizes the group commits: how many transactions of acks and of
// reads may be in flight, the acks' linger (see batch.Config; reads do
// not linger), and the most reports per transaction. Timeout bounds a
// report whose context has no deadline (request_timeout).
type Config struct {
	AckWorkers, ReadWorkers int
	AckLinger               time.Duration
	MaxBatch                int
	Timeout                 time.Duration
	Acks, Reads             Metrics
}

// New starts the group-commit workers.
func New(st *store.Store, rdb redis.UniversalClient, prefix string, log *slog.Logger, cfg Config) *Cursors {
	c := &Cursors{st: st, rdb: rdb, prefix: prefix, log: log, ackMetrics: cfg.Acks, readMetrics: cfg.Reads}
	c.acks = batch.NewSharded(batch.Config{Workers: cfg.AckWorkers, Max: cfg.MaxBatch, Queue: cfg.MaxBatch * cfg.AckWorkers * 4,
		Linger: cfg.AckLinger, Timeout: cfg.Timeout, Sizes: cfg.Acks.Sizes, Waits: cfg.Acks.Queue}, c.commit)
	// Reads do not linger: a read is what makes the badge vanish on the
	// user's other devices, and reads are far fewer than acks, so the
	// bigger batches a linger would buy are not worth its latency
	// (BENCHMARKS.md, the row "at 95a2ab7" on read_ok at 5,000 reads/s).
	c.reads = batch.NewSharded(batch.Config{Workers: cfg.ReadWorkers, Max: cfg.MaxBatch, Queue: cfg.MaxBatch * cfg.ReadWorkers * 4,
		Timeout: cfg.Timeout, Sizes: cfg.Reads.Sizes, Waits: cfg.Reads.Queue}, c.commitReads)
	return c
}

// Close finishes queued acks and reads.
func (c *Cursors) Close() {
	c.acks.Close()
	c.reads.Close()
}

// Key is the Redis hash of a device's delivery cursors (field: conv).
func (c *Cursors) Key(user, device string) string {
	return c.prefix + "dc:{" + user + "}:" + device
}

// Merge queues a; done is called once, after the merge is durable. ctx's
// deadline bounds the work done for a, in the batch it shares.
//
// Acks with the same key (one connection's) are merged in order, so each
// reply covers every earlier ack of that connection.
func (c *Cursors) Merge(ctx context.Context, key uint64, a Ack, done func(Result)) {
	c.acks.Submit(ctx, key, a, func(r Result, err error) {
		if err != nil {
			r = Result{Err: err}
		}
		done(r)
	})
}

// commit merges a batch of acks: PostgreSQL, then the hot copy.
func (c *Cursors) commit(ctx context.Context, ups []Ack) ([]Result, error) {
	start := time.Now()
	res, err := c.st.MergeCursors(ctx, ups)
	start = batch.ObserveSince(c.ackMetrics.Postgres, start)
	if err != nil {
		return nil, err
	}
	// Hot copy: best effort, a max-merge, so a failure here only leaves
	// Redis behind PostgreSQL until the next ack.
	var keys []string
	var args []any
	for i, r := range res {
		if r.Err == nil {
			a := ups[i]
			keys, args = append(keys, c.Key(a.User, a.Device)), append(args, a.Conv, r.Delivered)
		}
	}
	c.hotCopy(ctx, keys, args, "cursor hot copy")
	batch.ObserveSince(c.ackMetrics.Redis, start)
	return res, nil
}

// Forget deletes the device's hot cursors (after a reinstall).
func (c *Cursors) Forget(ctx context.Context, user, device string) error {
	return c.rdb.Del(ctx, c.Key(user, device)).Err()
}

// ReadKey is the Redis hash of a user's read positions (field: conv).
func (c *Cursors) ReadKey(user string) string { return c.prefix + "rp:{" + user + "}" }

// Read queues a read report; done is called once, after the merged read
// position is durable in PostgreSQL (group committed with other reports)
// and, if it advanced, max-merged into the Redis hot copy.
// Reports are queued by user, so one user's are merged in order. A read
// position's write holds its user's lock: the reports of one user's
// devices in two commit queues would wait for each other's commit; in
// one they share a batch.
func (c *Cursors) Read(ctx context.Context, r store.ReadUpdate, done func(store.ReadResult)) {
	h := fnv.New64a()
	_, _ = h.Write([]byte(r.User))
	c.reads.Submit(ctx, h.Sum64(), r, func(res store.ReadResult, err error) {
		if err != nil {
			res = store.ReadResult{Err: err}
		}
		done(res)
	})
}

// commitReads merges a batch of read reports: PostgreSQL, then the hot
// copy of the positions that advanced.
func (c *Cursors) commitReads(ctx context.Context, ups []store.ReadUpdate) ([]store.ReadResult, error) {
	start := time.Now()
	res, err := c.st.MarkReads(ctx, ups)
	start = batch.ObserveSince(c.readMetrics.Postgres, start)
	if err != nil {
		return nil, err
	}
	var keys []string
	var args []any
	for i, r := range res {
		if r.Err == nil && r.Advanced {
			keys, args = append(keys, c.ReadKey(ups[i].User)), append(args, ups[i].Conv, r.Read)
		}
	}
	c.hotCopy(ctx, keys, args, "read hot copy")
	batch.ObserveSince(c.readMetrics.Redis, start)
	return res, nil
}

// hotCopy max-merges the Redis hot copies: keys[i] is a hash, args holds
// its field and value in turn. Best effort: a failure only leaves Redis
// behind PostgreSQL until the next update.
func (c *Cursors) hotCopy(ctx context.Context, keys []string, args []any, what string) {
	if len(keys) == 0 {
		return
	}
	_, errs := scripts.RunMany(ctx, c.rdb, scripts.HashMax, keys, []any{0}, 2, args)
	for _, err := range errs {
		if err != nil {
			c.log.Debug(what, "err", err)
			return
		}
	}
}
