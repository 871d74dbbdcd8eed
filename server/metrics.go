package server

import (
	"context"
	"errors"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/cursor"
)

// storeMetrics are the process's metrics of its stores: how many items
// each PostgreSQL group commit carries, and Redis errors.
type storeMetrics struct {
	batchSizes  *prometheus.HistogramVec
	stages      *prometheus.HistogramVec
	redisErrors *prometheus.CounterVec
	// The membership check before a send's seq is allocated (eventlog),
	// and the removals other processes told its cache of (fanout.Bus).
	memberLookups  *prometheus.CounterVec
	removalNotices prometheus.Counter
}

func newStoreMetrics(reg prometheus.Registerer) storeMetrics {
	m := storeMetrics{
		batchSizes: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "parley_postgres_batch_size",
			Help:    "Items per PostgreSQL group commit, by kind (send, ack, read).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}}, []string{"kind"}),
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "parley_commit_stage_seconds",
			Help: "Where group-committed requests spend their time, by kind (send, ack, read) and stage: " +
				"queue (per request: waiting for a commit worker); per batch: resends (a send batch's lookup of " +
				"messages already stored, before allocating seqs), redis (a send batch's seq allocation, " +
				"an ack or read batch's hot copy), postgres (the batch's statement and commit).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14)}, []string{"kind", "stage"}),
		redisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "parley_redis_errors_total",
			Help: "Redis commands that failed (not counting nil replies), by kind: cmd or pipeline."}, []string{"kind"}),
		memberLookups: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "parley_membership_lookups_total",
			Help: "PostgreSQL lookups of the membership check before a send's seq is allocated, by path: " +
				"send (a send waited for it) or refresh (made in the background for senders who keep sending)."}, []string{"path"}),
		removalNotices: prometheus.NewCounter(prometheus.CounterOpts{Name: "parley_membership_removal_notices_total",
			Help: "Membership removals this process's membership check was told of by the bus (its own included)."}),
	}
	reg.MustRegister(m.batchSizes, m.stages, m.redisErrors, m.memberLookups, m.removalNotices)
	return m
}

// redisErrorHook counts failed Redis commands.
type redisErrorHook struct{ errs *prometheus.CounterVec }

func (h redisErrorHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			h.errs.WithLabelValues("dial").Inc()
		}
		return c, err
	}
}

func (h redisErrorHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && !errors.Is(err, redis.Nil) {
			h.errs.WithLabelValues("cmd").Inc()
		}
		return err
	}
}

func (h redisErrorHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err != nil && !errors.Is(err, redis.Nil) {
			h.errs.WithLabelValues("pipeline").Inc()
		}
		return err
	}
}

// commitMetrics are the observers of one kind of group commit.
func (m storeMetrics) commitMetrics(kind string) cursor.Metrics {
	return cursor.Metrics{Sizes: m.batchSizes.WithLabelValues(kind), Queue: m.stages.WithLabelValues(kind, "queue"),
		Postgres: m.stages.WithLabelValues(kind, "postgres"), Redis: m.stages.WithLabelValues(kind, "redis")}
}
