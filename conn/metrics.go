package conn

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/parley-im/parley/wire"
)

// metrics of the gateway. Labels are low-cardinality: frame types, reasons.
type metrics struct {
	connections prometheus.Gauge
	framesIn    *prometheus.CounterVec
	framesOut   *prometheus.CounterVec
	pushesOut   prometheus.Counter // framesOut of push: resolved once, counted per batch
	errors      *prometheus.CounterVec
	drops       *prometheus.CounterVec
	refusals    *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	combined    *prometheus.HistogramVec
	acksHeld    prometheus.Counter // rid-less acks held (ack_coalesce)
	acksFlushed prometheus.Counter // held acks handed to the commit queue
	typing      *prometheus.CounterVec
	receipts    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "parley_gateway_connections", Help: "Open client connections."}),
		framesIn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_gateway_frames_in_total", Help: "Frames received, by type (\"invalid\" for undecodable)."}, []string{"type"}),
		framesOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_gateway_frames_out_total", Help: "Frames sent, by type."}, []string{"type"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_gateway_errors_total", Help: "Error replies, by code."}, []string{"code"}),
		drops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_gateway_drops_total", Help: "Pushes not written, by reason."}, []string{"reason"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_gateway_refusals_total", Help: "Requests refused with RATE_LIMITED before any work, by reason (\"auth_rate\": over auth_rate)."}, []string{"reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "parley_gateway_request_seconds", Help: "Time from a request's arrival (read by the event loop) to its reply being queued for writing, by type.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16)}, []string{"type"}),
		combined: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "parley_gateway_combined_requests", Help: "Requests answered by one database statement, by type (snapshot, auth).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10)}, []string{"type"}),
		acksHeld: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "parley_gateway_acks_held_total", Help: "Acks without rid of seqs the connection was given, held for ack_coalesce instead of committed one by one."}),
		acksFlushed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "parley_gateway_acks_held_committed_total", Help: "Held acks handed to the commit queue: one per device and conversation per ack_coalesce, whatever parley_gateway_acks_held_total received."}),
	}
	m.typing = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "parley_gateway_typing_total", Help: "Typing frames received from members, by outcome (relayed; dropped_rate: over one per device and conversation per 2 s; dropped_busy: the frame queue was full; skipped_tier: not a push-tier conversation)."}, []string{"outcome"})
	m.receipts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "parley_gateway_receipts_sent_total", Help: "Receipt pushes sent (each to every other current member's online devices), after coalescing."})
	m.pushesOut = m.framesOut.WithLabelValues(wire.TPush)
	if reg != nil {
		reg.MustRegister(m.connections, m.framesIn, m.framesOut, m.errors, m.drops, m.refusals, m.latency, m.combined, m.acksHeld, m.acksFlushed, m.typing, m.receipts)
	}
	return m
}
