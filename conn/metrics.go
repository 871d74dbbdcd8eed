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
	auths       *prometheus.CounterVec // auth and refresh outcomes, by method and result
	kicks       *prometheus.CounterVec // lifecycle and expiry kicks, by reason
	latency     *prometheus.HistogramVec
	combined    *prometheus.HistogramVec
	acksHeld    prometheus.Counter // rid-less acks held (ack_coalesce)
	acksFlushed prometheus.Counter // held acks handed to the commit queue
	typing      *prometheus.CounterVec
	receipts    prometheus.Counter

	proxy        *prometheus.CounterVec // PROXY headers by result
	wsHandshakes *prometheus.CounterVec // WebSocket upgrades by result
	wsErrors     *prometheus.CounterVec // WebSocket frames refused, by reason
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
			Name: "parley_gateway_drops_total", Help: "Frames not written, by reason: slow_device (a push to a device over max_outbound, owed as a hint), slow_device_closed (a device twice over it, closed), slow_device_relay (a typing or receipt frame to a device over it)."}, []string{"reason"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_gateway_refusals_total", Help: "Requests refused with RATE_LIMITED before any work, by reason (\"auth_rate\": over auth_rate; \"addr_auth_rate\": over addr_auth_rate; \"addr_conns\": over addr_max_conns)."}, []string{"reason"}),
		auths: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_gateway_auths_total", Help: "Auth and refresh requests answered, by method (token, jwt, refresh) and result (ok, provisioned, bad_token, bad_jwt, too_large, expired, jwt_off, unknown, other_user, other_device, not_jwt, revoked, suspended, backend_error)."}, []string{"method", "result"}),
		kicks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_gateway_kicks_total", Help: "Connections closed by a lifecycle change or expiry, by reason (revoked, suspended, expired)."}, []string{"reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "parley_gateway_request_seconds", Help: "Time from a request's arrival (read by the event loop) to its reply being queued for writing, by type.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16)}, []string{"type"}),
		combined: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "parley_gateway_combined_requests", Help: "Requests answered by one database statement, by type (snapshot; auth: the device lookup; provision: first JWT logins; register: entering the route table; online: joining the online index of big conversations; members: member lists for typing and receipts; disconnect: closed connections leaving the route table and the online index; receipt: read receipts' durable read positions, coalescing gate and privacy).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10)}, []string{"type"}),
		acksHeld: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "parley_gateway_acks_held_total", Help: "Acks without rid of seqs the connection was given, held for ack_coalesce instead of committed one by one."}),
		acksFlushed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "parley_gateway_acks_held_committed_total", Help: "Held acks handed to the commit queue: one per device and conversation per ack_coalesce, whatever parley_gateway_acks_held_total received."}),
		proxy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_gateway_proxy_headers_total", Help: "PROXY protocol headers (proxy_protocol on), by result: ok; untrusted (the peer is not in proxy_trusted); missing (no header: other bytes, or none before the peer closed or auth_timeout passed); truncated (closed inside a header); malformed. All but ok close the connection."}, []string{"result"}),
		wsHandshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_gateway_ws_handshakes_total", Help: "WebSocket upgrade requests, by result: ok; bad_request (not a valid upgrade: method, version, key); path (not /v1/ws); origin (not in ws_origins); too_large (over 8 KiB); truncated (closed inside the request)."}, []string{"result"}),
		wsErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_gateway_ws_errors_total", Help: "WebSocket frames refused, by reason: text (a text message: BAD_FRAME); unmasked (close 1002); protocol (reserved bits or opcodes, bad fragmentation or control frames: close 1002); too_large (a message over max_frame: TOO_LARGE, close 1009); fragments (a message in over 1024 frames: TOO_LARGE, close 1009)."}, []string{"reason"}),
	}
	m.typing = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "parley_gateway_typing_total", Help: "Typing frames received from members, by outcome (relayed; dropped_rate: over one per device and conversation per 2 s; dropped_busy: the frame queue was full; skipped_tier: not a push-tier conversation)."}, []string{"outcome"})
	m.receipts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "parley_gateway_receipts_sent_total", Help: "Receipt pushes sent (each to every other current member's online devices), after coalescing."})
	m.pushesOut = m.framesOut.WithLabelValues(wire.TPush)
	if reg != nil {
		reg.MustRegister(m.connections, m.framesIn, m.framesOut, m.errors, m.drops, m.refusals, m.auths, m.kicks, m.latency, m.combined, m.acksHeld, m.acksFlushed, m.typing, m.receipts, m.proxy, m.wsHandshakes, m.wsErrors)
	}
	return m
}
