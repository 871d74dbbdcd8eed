package notify

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	sent       *prometheus.CounterVec // provider
	failed     *prometheus.CounterVec // provider, reason: refusals, retried or not
	dropped    *prometheus.CounterVec // provider, reason: notifications given up
	duplicated *prometheus.CounterVec // provider
	skipped    *prometheus.CounterVec // reason: the policy said no
	backlog    prometheus.Gauge
	latency    *prometheus.HistogramVec // provider
	claims     prometheus.Counter
	deferred   *prometheus.CounterVec // provider
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "parley_notify_sent_total",
			Help: "Notifications a provider accepted, by provider."}, []string{"provider"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "parley_notify_failed_total",
			Help: "Provider requests that failed, by provider and reason (bad_token, throttled, unavailable, rejected, config: the provider refused the server's credentials, APNs topic or FCM project); throttled and unavailable ones are retried."},
			[]string{"provider", "reason"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "parley_notify_dropped_total",
			Help: "Notifications given up, by provider and reason (bad_token, rejected, config: the provider refused the server's configuration, expired: notify_ttl passed while retrying, unregistered, no_provider, intake_full)."},
			[]string{"provider", "reason"}),
		duplicated: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "parley_notify_duplicated_total",
			Help: "Notifications sent again after a worker that had taken them stopped before recording the outcome: the provider may have received them twice (same idempotency key)."},
			[]string{"provider"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "parley_notify_skipped_total",
			Help: "Registered recipient devices not notified of a message, by reason (acked: the device acked it in time; muted)."},
			[]string{"reason"}),
		backlog: prometheus.NewGauge(prometheus.GaugeOpts{Name: "parley_notify_backlog",
			Help: "Notification jobs queued (waiting for notify_delay, for a provider, or for a retry), sampled each second."}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "parley_notify_latency_seconds",
			Help:    "From a message's commit to a provider accepting its notification (includes notify_delay), by provider.",
			Buckets: prometheus.ExponentialBuckets(0.05, 1.5, 20)}, []string{"provider"}),
		claims: prometheus.NewCounter(prometheus.CounterOpts{Name: "parley_notify_claims_total",
			Help: "Looks at a queue shard's due jobs (a Redis script each): when its next job is due, when this process queued or finished one of its jobs, and at least once a second per shard."}),
		deferred: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "parley_notify_deferred_total",
			Help: "Notifications put back for a second because their provider's queue stayed full (its workers busy or hanging), by provider."},
			[]string{"provider"}),
	}
	if reg != nil {
		reg.MustRegister(m.sent, m.failed, m.dropped, m.duplicated, m.skipped, m.backlog, m.latency, m.claims, m.deferred)
	}
	return m
}
