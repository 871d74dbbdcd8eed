package fanout

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/vmihailenco/msgpack/v5"
)

// Rows keeps every user's conversation rows, the per-member half of write
// fan-out (docs/fanout.md, "Conversation rows"): one Redis sorted set per
// user, key rows:{user}, member a conversation id, score the ts of the newest
// event of that conversation the user may see. convs orders a user's push-tier
// conversations by them instead of probing every conversation's log.
//
// Row writes are durable work: after a commit, fan-out appends one job
// per batch of events to a Redis Stream, and workers of every process
// read it through one consumer group. A worker that dies holding entries
// leaves them pending; the others claim them (XAUTOCLAIM) once they have
// been idle for ClaimIdle and finish them. Every write is a ZADD GT, so a
// job run twice changes nothing. A message is never rolled back because
// its rows were not written: a row that is missing is rebuilt from
// PostgreSQL by the next convs that needs it.
type Rows struct {
	// Static after construction.
	rdb      redis.UniversalClient
	prefix   string
	stream   string
	consumer string
	cfg      RowsConfig
	log      *slog.Logger
	metrics  rowsMetrics

	// Jobs waiting to be appended to the stream by the appender (one
	// XADD for many fan-out batches, off fan-out's critical path).
	queue chan []RowJob

	// Jobs that could not be appended to the stream (Redis was down);
	// retried by the reclaim loop, bounded by maxRetryJobs.
	rmu   sync.Mutex
	retry []RowJob

	stop chan struct{}
	wg   sync.WaitGroup // the appender and the reclaim loop
	// The stream readers. busy is read-held while one handles entries it
	// read, so Close waits for that work but not for a read blocked in
	// Redis (up to readBlock); readers counts the running ones (Wait).
	busy    sync.RWMutex
	readers sync.WaitGroup
}

// RowsConfig tunes the row writers.
type RowsConfig struct {
	Workers   int           // stream readers in this process
	ClaimIdle time.Duration // a pending entry idle this long is claimed by another worker
	Timeout   time.Duration // bounds each batch's work against Redis and PostgreSQL (request_timeout)
}

// RowJob asks for conv's row of each of Users to be raised to Ts.
type RowJob struct {
	Conv  string   `msgpack:"c"`
	Ts    int64    `msgpack:"t"`
	Users []string `msgpack:"u"`
}

const (
	rowsGroup     = "rows"
	maxRetryJobs  = 100000
	maxEntryUsers = 10000
	appendLinger  = 10 * time.Millisecond
	// readBlock is how long a worker's read of the stream waits for
	// entries (XREADGROUP BLOCK) before it looks at whether to stop.
	readBlock = time.Second
)

// timeout bounds each batch's work against the stores (RowsConfig.Timeout,
// 10 s if unset).
func (r *Rows) timeout() time.Duration { return cmp.Or(r.cfg.Timeout, 10*time.Second) }

type rowsMetrics struct {
	backlog prometheus.Gauge
	written prometheus.Counter
	claimed prometheus.Counter
	lost    prometheus.Counter
}

// NewRows returns the row keeper; consumer names this process's workers
// in the consumer group (unique per process: gateway id and boot id).
// Start runs the workers.
func NewRows(rdb redis.UniversalClient, prefix, consumer string, cfg RowsConfig, log *slog.Logger, reg prometheus.Registerer) *Rows {
	r := &Rows{rdb: rdb, prefix: prefix, stream: prefix + "fanout:{rows}", consumer: consumer, cfg: cfg, log: log,
		stop: make(chan struct{}), queue: make(chan []RowJob, 4096)}
	r.metrics = rowsMetrics{
		backlog: prometheus.NewGauge(prometheus.GaugeOpts{Name: "parley_fanout_backlog",
			Help: "Row-write jobs in the fan-out stream not finished yet (sampled each second)."}),
		written: prometheus.NewCounter(prometheus.CounterOpts{Name: "parley_fanout_row_writes_total",
			Help: "Per-member conversation row writes (Redis ZADD) done by this process."}),
		claimed: prometheus.NewCounter(prometheus.CounterOpts{Name: "parley_fanout_claimed_total",
			Help: "Fan-out stream entries claimed from a worker that stopped before finishing them."}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{Name: "parley_fanout_jobs_dropped_total",
			Help: "Row-write jobs dropped because Redis stayed down too long (rows are rebuilt by convs)."}),
	}
	if reg != nil {
		reg.MustRegister(r.metrics.backlog, r.metrics.written, r.metrics.claimed, r.metrics.lost)
	}
	return r
}

// key is the rows key of user.
func (r *Rows) key(user string) string { return r.prefix + "rows:{" + user + "}" }

// Start creates the consumer group if needed and starts the workers.
func (r *Rows) Start(ctx context.Context) error {
	if err := r.ensureGroup(ctx); err != nil {
		return err
	}
	for i := 0; i < r.cfg.Workers; i++ {
		r.readers.Add(1)
		go r.work(fmt.Sprintf("%s-%d", r.consumer, i))
	}
	r.wg.Add(2)
	go r.reclaimLoop()
	go r.appender()
	return nil
}

// Close stops the workers; entries they did not finish stay pending for
// the other processes (or this one's next start) to claim. It waits for
// the work in hand, not for reads blocked in Redis: those end when their
// block times out or the Redis client is closed (Wait), and what they
// read is left pending like the rest.
func (r *Rows) Close() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	r.busy.Lock()
	defer r.busy.Unlock()
	r.wg.Wait()
}

// Wait returns once every stream reader has returned (after Close, once
// its read ended).
func (r *Rows) Wait() { r.readers.Wait() }

func (r *Rows) stopped() bool {
	select {
	case <-r.stop:
		return true
	default:
		return false
	}
}

func (r *Rows) ensureGroup(ctx context.Context) error {
	err := r.rdb.XGroupCreateMkStream(ctx, r.stream, rowsGroup, "0").Err()
	if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
		return fmt.Errorf("rows: creating consumer group: %w", err)
	}
	return nil
}

// Write writes the rows of jobs now (one pipeline of ZADD GT), or, if
// Redis fails, queues them (Queue) to be written by the stream's workers.
func (r *Rows) Write(ctx context.Context, jobs []RowJob) {
	if len(jobs) == 0 {
		return
	}
	if err := r.apply(ctx, jobs); err != nil {
		r.log.Debug("writing rows at the commit; queued to the stream", "err", err)
		r.Queue(context.WithoutCancel(ctx), jobs)
	}
}

// Queue hands jobs to the appender, which appends them to the stream
// with others (one entry per XADD). If it is behind, Queue appends them
// itself. If Redis cannot take them, the jobs are kept and retried.
func (r *Rows) Queue(ctx context.Context, jobs []RowJob) {
	if len(jobs) == 0 {
		return
	}
	select {
	case r.queue <- jobs:
		return
	default:
	}
	r.append(ctx, jobs)
}

// appender appends queued jobs to the stream, many fan-out batches per
// entry. On Close it appends what is queued.
func (r *Rows) appender() {
	defer r.wg.Done()
	for {
		var jobs []RowJob
		select {
		case <-r.stop:
			for {
				select {
				case js := <-r.queue:
					jobs = append(jobs, js...)
				default:
					ctx, cancel := context.WithTimeout(context.Background(), r.timeout())
					r.append(ctx, jobs)
					cancel()
					return
				}
			}
		case js := <-r.queue:
			jobs = js
		}
		// One entry carries the jobs of up to appendLinger (at most about
		// maxEntryUsers row writes): a few milliseconds of lag buys one
		// XADD, one XREADGROUP and one acknowledgement for many messages.
		users := 0
		for _, j := range jobs {
			users += len(j.Users)
		}
		linger := time.NewTimer(appendLinger)
	more:
		for users < maxEntryUsers {
			select {
			case js := <-r.queue:
				jobs = append(jobs, js...)
				for _, j := range js {
					users += len(j.Users)
				}
			case <-linger.C:
				break more
			case <-r.stop:
				break more
			}
		}
		linger.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), r.timeout())
		r.append(ctx, jobs)
		cancel()
	}
}

func (r *Rows) append(ctx context.Context, jobs []RowJob) {
	if len(jobs) == 0 {
		return
	}
	if err := r.add(ctx, jobs); err != nil {
		r.log.Debug("queueing row writes; will retry", "err", err)
		r.rmu.Lock()
		if len(r.retry)+len(jobs) <= maxRetryJobs {
			r.retry = append(r.retry, jobs...)
		} else {
			r.metrics.lost.Add(float64(len(jobs)))
		}
		r.rmu.Unlock()
	}
}

func (r *Rows) add(ctx context.Context, jobs []RowJob) error {
	payload, err := msgpack.Marshal(jobs)
	if err != nil {
		return err
	}
	return r.rdb.XAdd(ctx, &redis.XAddArgs{Stream: r.stream, Values: []any{"j", payload}}).Err()
}

func (r *Rows) work(name string) {
	defer r.readers.Done()
	for !r.stopped() {
		ctx, cancel := context.WithTimeout(context.Background(), readBlock+r.timeout())
		res, err := r.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: rowsGroup, Consumer: name,
			Streams: []string{r.stream, ">"}, Count: 64, Block: readBlock}).Result()
		cancel()
		switch {
		case errors.Is(err, redis.Nil):
			continue
		case redis.HasErrorPrefix(err, "NOGROUP"):
			// Redis lost the stream (flushed or restarted empty).
			ctx, cancel := context.WithTimeout(context.Background(), r.timeout())
			if err := r.ensureGroup(ctx); err != nil {
				r.log.Debug("rows", "err", err)
			}
			cancel()
			continue
		case err != nil:
			r.log.Debug("reading the fan-out stream", "err", err)
			select {
			case <-r.stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		r.busy.RLock()
		if r.stopped() { // read while Close waited: leave it pending
			r.busy.RUnlock()
			return
		}
		for _, s := range res {
			r.process(s.Messages)
		}
		r.busy.RUnlock()
	}
}

// process runs the jobs of msgs, then acknowledges and deletes them (the
// stream's length is the backlog). Entries whose writes failed stay
// pending and are claimed again later.
func (r *Rows) process(msgs []redis.XMessage) {
	if len(msgs) == 0 {
		return
	}
	var jobs []RowJob
	ids := make([]string, 0, len(msgs))
	for _, m := range msgs {
		ids = append(ids, m.ID)
		p, ok := m.Values["j"].(string)
		if !ok {
			continue
		}
		var js []RowJob
		if err := msgpack.Unmarshal([]byte(p), &js); err != nil {
			r.log.Warn("undecodable fan-out entry dropped", "id", m.ID, "err", err)
			continue
		}
		jobs = append(jobs, js...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout())
	defer cancel()
	if err := r.apply(ctx, jobs); err != nil {
		r.log.Debug("writing rows; the entries stay pending", "err", err)
		return
	}
	_, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.XAck(ctx, r.stream, rowsGroup, ids...)
		p.XDel(ctx, r.stream, ids...)
		return nil
	})
	if err != nil {
		r.log.Debug("acknowledging fan-out entries", "err", err)
	}
}

// apply writes the rows of jobs (ZADD GT: idempotent, never lowers a row).
func (r *Rows) apply(ctx context.Context, jobs []RowJob) error {
	type key struct{ user, conv string }
	top := map[key]int64{}
	for _, j := range jobs {
		for _, u := range j.Users {
			k := key{u, j.Conv}
			if j.Ts > top[k] {
				top[k] = j.Ts
			}
		}
	}
	if len(top) == 0 {
		return nil
	}
	_, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, ts := range top {
			p.ZAddGT(ctx, r.key(k.user), redis.Z{Score: float64(ts), Member: k.conv})
		}
		return nil
	})
	if err == nil {
		r.metrics.written.Add(float64(len(top)))
	}
	return err
}

// reclaimLoop claims entries left pending by workers that stopped, retries
// jobs that could not be queued, and samples the backlog.
func (r *Rows) reclaimLoop() {
	defer r.wg.Done()
	every := min(r.cfg.ClaimIdle/2, time.Second)
	t := time.NewTicker(max(every, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.timeout())
		r.retryQueued(ctx)
		r.reclaim(ctx)
		if n, err := r.rdb.XLen(ctx, r.stream).Result(); err == nil {
			r.metrics.backlog.Set(float64(n))
		}
		cancel()
	}
}

func (r *Rows) retryQueued(ctx context.Context) {
	r.rmu.Lock()
	jobs := r.retry
	r.retry = nil
	r.rmu.Unlock()
	for len(jobs) > 0 {
		n := min(len(jobs), 1000)
		if err := r.add(ctx, jobs[:n]); err != nil {
			r.rmu.Lock()
			r.retry = append(r.retry, jobs...)
			r.rmu.Unlock()
			return
		}
		jobs = jobs[n:]
	}
}

func (r *Rows) reclaim(ctx context.Context) {
	start := "0-0"
	for i := 0; i < 100; i++ { // bounded: at most 100 × 100 entries per round
		msgs, next, err := r.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: r.stream, Group: rowsGroup,
			Consumer: r.consumer + "-claim", MinIdle: r.cfg.ClaimIdle, Start: start, Count: 100}).Result()
		if err != nil {
			if !errors.Is(err, redis.Nil) && !redis.HasErrorPrefix(err, "NOGROUP") {
				r.log.Debug("claiming fan-out entries", "err", err)
			}
			return
		}
		if len(msgs) > 0 {
			r.metrics.claimed.Add(float64(len(msgs)))
			r.process(msgs)
		}
		if next == "0-0" || next == "" {
			return
		}
		start = next
	}
}

// Read returns user's rows: conversation → ts of its newest visible event.
func (r *Rows) Read(ctx context.Context, user string) (map[string]int64, error) {
	zs, err := r.rdb.ZRangeWithScores(ctx, r.key(user), 0, -1).Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(zs))
	for _, z := range zs {
		if c, ok := z.Member.(string); ok {
			out[c] = int64(z.Score)
		}
	}
	return out, nil
}

// Backfill writes rows that convs found missing or behind (ZADD GT).
func (r *Rows) Backfill(ctx context.Context, user string, rows map[string]int64) error {
	if len(rows) == 0 {
		return nil
	}
	zs := make([]redis.Z, 0, len(rows))
	for c, ts := range rows {
		zs = append(zs, redis.Z{Score: float64(ts), Member: c})
	}
	return r.rdb.ZAddGT(ctx, r.key(user), zs...).Err()
}
