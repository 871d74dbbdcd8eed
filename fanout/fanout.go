// Package fanout delivers committed events to the online devices of the
// members who may see them, by tier (docs/fanout.md, "Tiers"). Push-tier
// conversations (fewer than write_fanout_max members) fan out by their
// recipients, the members whose periods contain the event's seq (no
// user receives an event outside their membership periods), whose
// devices it looks up in the routing table; online- and pull-tier
// conversations fan out from their online index (package route), so a
// message costs its online devices, not its members. Each push frame is
// encoded once and handed to the gateways holding the devices: directly
// to this process's gateway, through Redis pub/sub (Bus) to the others.
//
// Per-member conversation rows (Rows) order convs: those of push-tier
// events are written when they are committed, before anyone is told of
// them (a reply or a push), so that a convs that follows orders by them;
// writes that fail go to a Redis Stream read by a consumer group,
// reclaimed from dead workers.
//
// Pushes are hints with payload: a push that is lost (a gateway died, a
// device was too slow) is repaired by the client's sync. Fan-out never
// rolls back or delays a commit.
package fanout

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/internal/backend"
	"github.com/parley-im/parley/internal/periodic"
	"github.com/parley-im/parley/route"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/wire"
)

// Target is one device a frame goes to.
type Target struct {
	Device string `msgpack:"d"`
	Token  int64  `msgpack:"k"` // the connection's fencing token
}

// Delivery is one event's push frame for devices on one gateway.
type Delivery struct {
	Conv    string   `msgpack:"c"`
	Seq     int64    `msgpack:"s"`
	Frame   []byte   `msgpack:"f"` // the encoded push (length prefix included), shared by all targets
	Targets []Target `msgpack:"t"`
	// Coalesce: a big group's push, which may wait push_coalesce in the
	// device's outbox to share a write with others.
	Coalesce bool `msgpack:"l,omitempty"`
	// Relayed: a typing or receipt frame (ToUsers), which may wait
	// relay_coalesce in the device's outbox to share a write with others.
	Relayed bool `msgpack:"b,omitempty"`
}

// Local is the gateway of this process: it writes frames to its own
// connections.
type Local interface {
	Deliver(ds []Delivery)
	// Backlogged reports whether the gateway's reads queue for PostgreSQL
	// (a reconnect storm's auths and snapshots): the dense_seq advance
	// then waits, up to denseDeferMax.
	Backlogged() bool
}

// Fanout runs the delivery workers.
type Fanout struct {
	// Static after construction.
	st     *store.Store
	routes *route.Table
	bus    *Bus
	log    *slog.Logger
	rows   *Rows
	// Tier thresholds (Mode): conversations with fewer than writeMax
	// members are in the push tier, up to onlineMax in the online tier,
	// above it in the pull tier.
	writeMax, onlineMax int
	timeout             time.Duration // bounds each batch's work against the stores
	metrics             fanoutMetrics

	// Set by Start, before the goroutines that read it start.
	local Local

	// One queue per worker; a conversation's events always go to the same
	// worker, so its pushes leave in the order they were committed.
	queues  []chan []eventlog.Committed
	pending atomic.Int64 // events enqueued and not delivered yet
	wg      sync.WaitGroup

	// Conversations with commits whose dense_seq watermark has not been
	// advanced yet, with how many and since when; advanceLoop advances
	// those with enough of them, or old enough (see advance).
	dmu   sync.Mutex
	dirty map[string]*pendingDense
	stop  chan struct{}
	// advancePhase: where in each second advanceLoop runs (package
	// periodic), away from the gateway's held-ack flushes.
	advancePhase float64

	// Frames for users' devices (ToUser), batched by notifyLoop so that
	// one pipelined route lookup serves every frame queued meanwhile.
	notes chan userFrame
	// The routes ToUsers frames reuse for relayRouteTTL, and, while a
	// batch's lookup runs (looking), the users whose connections on this
	// gateway opened or closed meanwhile (RoutesChanged: the lookup may
	// predate the change, so their routes from it are not kept). Only
	// notifyLoop looks routes up, one batch at a time.
	rmu          sync.Mutex
	relayRoutes  map[string]relayRoute // guarded by rmu
	looking      bool                  // guarded by rmu
	routeChanged map[string]struct{}   // guarded by rmu

	closeOnce sync.Once
}

// New returns fan-out with workers delivery queues, ready to take events
// (Enqueue); Start starts the goroutines that deliver them. ackFlush is
// the gateway's held-ack
// flush period (config ack_coalesce, 0 if acks are not held): the
// dense_seq advance, once a second, runs half of it (of a second at most)
// after a flush, so that for a period that divides a second (1s, the
// default, 500ms, 200ms, …) or is a whole number of seconds the two never
// reach PostgreSQL together.
func New(st *store.Store, routes *route.Table, bus *Bus, rows *Rows, cfg Config, log *slog.Logger, reg prometheus.Registerer) *Fanout {
	ackFlush := cfg.AckFlush
	if ackFlush <= 0 || ackFlush > time.Second {
		ackFlush = time.Second
	}
	f := &Fanout{st: st, routes: routes, bus: bus, rows: rows, writeMax: cfg.WriteMax, onlineMax: cfg.OnlineMax, timeout: cmp.Or(cfg.Timeout, 10*time.Second), log: log,
		metrics: newFanoutMetrics(reg), advancePhase: ackFlush.Seconds() / 2,
		dirty: map[string]*pendingDense{}, stop: make(chan struct{}), notes: make(chan userFrame, 4096)}
	for range cfg.Workers {
		f.queues = append(f.queues, make(chan []eventlog.Committed, 4096/cfg.Workers+1))
	}
	return f
}

// Config sets up fan-out: the tier thresholds (write_fanout_max,
// online_fanout_max), how many delivery workers, the gateway's held-ack
// flush interval (ack_coalesce; the watermark advances between its
// flushes), and Timeout, which bounds each batch's work against the
// stores (request_timeout; 10 s if unset).
type Config struct {
	WriteMax, OnlineMax int
	Workers             int
	AckFlush            time.Duration
	Timeout             time.Duration
}

// Start starts delivering, to local (this process's gateway) and over the
// bus; call it once, before Close.
func (f *Fanout) Start(local Local) {
	f.local = local
	f.wg.Add(len(f.queues) + 2)
	for _, q := range f.queues {
		go f.work(q)
	}
	go f.advanceLoop()
	go f.notifyLoop()
}

// Enqueue takes committed events (the conversation log's commit hook,
// which runs before their senders are answered): it writes the
// conversation rows of push-tier events, then queues the events for
// delivery. It blocks while the queue is full, which slows committers
// down rather than losing pushes.
func (f *Fanout) Enqueue(evs []eventlog.Committed) {
	f.writeRows(evs)
	f.pending.Add(int64(len(evs)))
	if len(f.queues) == 1 {
		f.queues[0] <- evs
		return
	}
	// Each queue's part is allocated at its size: events are a few
	// hundred bytes each, and growing the parts by appending copied them
	// about twice over.
	at := make([]uint32, len(evs))
	sizes := make([]int, len(f.queues))
	for k, e := range evs {
		h := fnv.New32a()
		_, _ = h.Write([]byte(e.Conv))
		at[k] = h.Sum32() % uint32(len(f.queues))
		sizes[at[k]]++
	}
	parts := make([][]eventlog.Committed, len(f.queues))
	for i, n := range sizes {
		if n > 0 {
			parts[i] = make([]eventlog.Committed, 0, n)
		}
	}
	for k, e := range evs {
		parts[at[k]] = append(parts[at[k]], e)
	}
	for i, p := range parts {
		if len(p) > 0 {
			f.queues[i] <- p
		}
	}
}

// Pending is how many enqueued events have not been delivered yet.
func (f *Fanout) Pending() int64 { return f.pending.Load() }

// Close delivers what is queued and stops the workers.
func (f *Fanout) Close() {
	f.closeOnce.Do(func() {
		for _, q := range f.queues {
			close(q)
		}
		close(f.stop)
	})
	f.wg.Wait()
}

// pendingDense is what a conversation committed above its dense_seq
// watermark since the last advance: how many events, and since when.
type pendingDense struct {
	n     int
	since time.Time
}

// A conversation's watermark is advanced once it has denseBatch events
// above it, or its oldest is denseMaxAge old. Every advance of a
// conversation writes its conversations row and its senders' bucket rows
// (WAL, dead tuples), whatever the number of events it passes: advancing
// every second a conversation that gets a message a second wrote those
// rows once per message. Below the watermark unread counting is a
// subtraction; above it, the events are counted one by one, which stays
// cheap for this many: never more than denseBatch, whatever the age. The
// age bounds how long a conversation stays in the dirty map. For
// conversations that get a message a second, 30 s instead of 10 means a
// third as many advances, and so about a third of the advance's WAL per
// message (BENCHMARKS.md, the row "974df89 against 2c01f4b"), for a map
// of the conversations active in the last 30 s.
//
// The advance by age is background work: while the gateway is
// backlogged (a reconnect storm), conversations wait until they are
// denseDeferMax old instead. A storm that followed a burst of messages
// otherwise met the advance of every conversation of the burst, which
// competed with the storm's snapshots for PostgreSQL (BENCHMARKS.md, the
// row "f461d8c against e5328fb + 37cdf11").
// Counting unread above the watermark stays exact, only a little longer;
// a conversation with denseBatch events above it is advanced anyway.
const (
	denseBatch    = 64
	denseMaxAge   = 30 * time.Second
	denseDeferMax = 90 * time.Second
)

func (f *Fanout) markDirty(evs []eventlog.Committed) {
	now := time.Now()
	f.dmu.Lock()
	for _, e := range evs {
		p := f.dirty[e.Conv]
		if p == nil {
			p = &pendingDense{since: now}
			f.dirty[e.Conv] = p
		}
		p.n++
	}
	f.dmu.Unlock()
}

// advanceLoop advances every second at advancePhase, between the
// gateway's held-ack flushes (package periodic): when both hit PostgreSQL
// at once, the inserts committing then waited behind them (BENCHMARKS.md,
// the row "1e07127…2ba6ac0").
func (f *Fanout) advanceLoop() {
	defer f.wg.Done()
	periodic.Run(f.stop, time.Second, f.advancePhase, func() { f.advance(false) })
	f.advance(true)
}

// advance raises the dense_seq watermark of the dirty conversations that
// have denseBatch events above it or have waited denseMaxAge
// (denseDeferMax while the gateway is backlogged); all of them if all.
func (f *Fanout) advance(all bool) {
	age := denseMaxAge
	if !all && f.local != nil && f.local.Backlogged() {
		age = denseDeferMax
		f.metrics.denseDeferred.Inc()
	}
	due := time.Now().Add(-age)
	f.dmu.Lock()
	var convs []string
	for c, p := range f.dirty {
		if all || p.n >= denseBatch || !p.since.After(due) {
			convs = append(convs, c)
			delete(f.dirty, c)
		}
	}
	f.dmu.Unlock()
	for len(convs) > 0 {
		n := min(len(convs), 500)
		ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
		if err := f.st.AdvanceDense(ctx, convs[:n]); err != nil {
			f.log.Debug("advancing dense_seq", "err", err)
		}
		cancel()
		convs = convs[n:]
	}
}

func (f *Fanout) work(queue chan []eventlog.Committed) {
	defer f.wg.Done()
	for evs := range queue {
		// Take whatever else is queued too: one store query and one
		// routing lookup serve them all.
	more:
		for len(evs) < 512 {
			select {
			case more, ok := <-queue:
				if !ok {
					break more
				}
				evs = append(evs, more...)
			default:
				break more
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
		if err := f.deliver(ctx, evs); err != nil {
			f.log.Warn("fan-out failed; clients will catch up by sync", "events", len(evs), "err", err)
		}
		f.markDirty(evs)
		cancel()
		f.pending.Add(-int64(len(evs)))
	}
}

func (f *Fanout) deliver(ctx context.Context, evs []eventlog.Committed) error {
	// Usually every event is of one tier: then evs is passed on as it is,
	// not copied.
	nPush := 0
	for _, e := range evs {
		if TierOf(e.Members, f.writeMax, f.onlineMax) == TierPush {
			nPush++
		}
	}
	var push, indexed []eventlog.Committed
	switch nPush {
	case len(evs):
		push = evs
	case 0:
		indexed = evs
	default:
		push, indexed = make([]eventlog.Committed, 0, nPush), make([]eventlog.Committed, 0, len(evs)-nPush)
		for _, e := range evs {
			if TierOf(e.Members, f.writeMax, f.onlineMax) == TierPush {
				push = append(push, e)
			} else {
				indexed = append(indexed, e)
			}
		}
	}
	var errs []error
	if len(push) > 0 {
		errs = append(errs, f.deliverPushTier(ctx, push))
	}
	if len(indexed) > 0 {
		errs = append(errs, f.deliverByOnlineIndex(ctx, indexed))
	}
	return errors.Join(errs...)
}

// deliverPushTier fans push-tier events out by their recipients: every
// recipient's devices get the push and every recipient's row is written.
func (f *Fanout) deliverPushTier(ctx context.Context, evs []eventlog.Committed) error {
	// Recipients: read by the commit for messages to small conversations;
	// one store query for the rest.
	recipients := make([][]string, len(evs))
	var keys []store.ConvSeq
	var at []int
	for i, e := range evs {
		if e.HaveRecipients {
			recipients[i] = e.Recipients
			continue
		}
		keys = append(keys, store.ConvSeq{Conv: e.Conv, Seq: e.Seq})
		at = append(at, i)
	}
	if len(keys) > 0 {
		rs, err := f.st.Recipients(ctx, keys)
		if err != nil {
			return err
		}
		for j, i := range at {
			recipients[i] = rs[j]
		}
	}
	if len(keys) > 0 {
		// Their rows could not be written at the commit (writeRows).
		defer f.queueRows(ctx, evs, recipients, at)
	}
	for _, e := range evs {
		if e.Kind == store.KindLeave && e.Members < int64(f.writeMax) && e.Members+int64(len(e.Users)) >= int64(f.writeMax) {
			// The conversation left the big tiers: its online index is
			// no longer read (it is rebuilt if the group grows again).
			if err := f.routes.DropOnline(ctx, e.Conv); err != nil {
				f.log.Debug("dropping online index", "conv", e.Conv, "err", err)
			}
		}
	}
	userSet := map[string]bool{}
	var users []string
	for _, rs := range recipients {
		for _, u := range rs {
			if !userSet[u] {
				userSet[u] = true
				users = append(users, u)
			}
		}
	}
	if len(users) == 0 {
		return nil
	}
	entries, err := f.routes.Lookup(ctx, users)
	if err != nil {
		return err
	}
	byUser := map[string][]route.Entry{}
	for _, e := range entries {
		byUser[e.User] = append(byUser[e.User], e)
	}
	out := deliveries{}
	for i, e := range evs {
		var frame []byte
		for _, u := range recipients[i] {
			for _, r := range byUser[u] {
				if r.Device == e.Device {
					continue // the sender's device got send_ok instead
				}
				if frame == nil {
					if frame, err = PushFrame(e.Event); err != nil {
						return err
					}
				}
				out.add(e.Event, frame, r, false)
			}
		}
	}
	f.dispatch(ctx, evs, out)
	return nil
}

// deliveries are push frames grouped by gateway.
type deliveries map[string][]Delivery

// add addresses frame (e's push) to the device of r; coalesce marks a
// big group's push (see Delivery).
func (d deliveries) add(e store.Event, frame []byte, r route.Entry, coalesce bool) {
	ds := d[r.Gateway]
	if n := len(ds); n > 0 && &ds[n-1].Frame[0] == &frame[0] {
		ds[n-1].Targets = append(ds[n-1].Targets, Target{Device: r.Device, Token: r.Token})
	} else {
		ds = append(ds, Delivery{Conv: e.Conv, Seq: e.Seq, Frame: frame, Targets: []Target{{Device: r.Device, Token: r.Token}}, Coalesce: coalesce})
	}
	d[r.Gateway] = ds
}

// dispatch hands each gateway its deliveries: this process's directly,
// the others' over the bus (one message per gateway).
func (f *Fanout) dispatch(ctx context.Context, evs []eventlog.Committed, out deliveries) {
	now := time.Now().UnixMilli()
	for _, e := range evs {
		f.metrics.latency.Observe(float64(now-e.Ts) / 1000)
	}
	for gw, ds := range out {
		for _, d := range ds {
			f.metrics.targets.Add(float64(len(d.Targets)))
		}
		if gw == f.routes.Gateway() {
			f.local.Deliver(ds)
			continue
		}
		if err := f.bus.Publish(ctx, gw, ds); err != nil {
			f.log.Warn("publishing to gateway", "gateway", gw, "err", err)
		}
	}
}

type fanoutMetrics struct {
	latency   prometheus.Histogram
	targets   prometheus.Counter
	events    *prometheus.CounterVec
	rowWrites *prometheus.CounterVec
	// Advance rounds in which the advance by age waited for a backlogged
	// gateway.
	denseDeferred prometheus.Counter
}

func newFanoutMetrics(reg prometheus.Registerer) fanoutMetrics {
	m := fanoutMetrics{
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "parley_fanout_delivery_seconds",
			Help:    "From an event's commit ts to its push frames being handed to the gateways (local or over the bus).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		targets: prometheus.NewCounter(prometheus.CounterOpts{Name: "parley_fanout_push_targets_total",
			Help: "Devices that push frames were addressed to (before any drop at the gateway)."}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "parley_fanout_events_total",
			Help: "Committed events fanned out, by tier (push, online, pull)."}, []string{"tier"}),
		rowWrites: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "parley_fanout_row_jobs_total",
			Help: "Per-member conversation row writes queued, by tier: write amplification is this over parley_fanout_events_total."}, []string{"tier"}),
		denseDeferred: prometheus.NewCounter(prometheus.CounterOpts{Name: "parley_dense_advance_deferred_total",
			Help: "Seconds in which the dense_seq advance of conversations by age waited because the gateway's auths or snapshots were queued (a reconnect storm)."}),
	}
	if reg != nil {
		reg.MustRegister(m.latency, m.targets, m.events, m.rowWrites, m.denseDeferred)
	}
	return m
}

// rowsTimeout bounds the row writes of one commit batch; past it they
// are queued to the durable stream instead.
const rowsTimeout = time.Second

// writeRows writes the conversation rows of the push-tier events of a
// commit batch (every recipient's row of the conversation rises to the
// event's ts), in one pipeline, before the batch's senders are answered
// and its pushes go out: a convs asked after a reply or a push orders by
// the event (docs/fanout.md, "Conversation rows"). Messages come with
// their recipients, read by the commit; other events' are read here (and
// kept on the events for delivery). Writes that fail are queued to the
// durable stream; an event whose recipients cannot be read has its rows
// queued by delivery (deliverPushTier).
func (f *Fanout) writeRows(evs []eventlog.Committed) {
	if f.rows == nil {
		return
	}
	var keys []store.ConvSeq
	var at []int
	small := 0
	for i, e := range evs {
		if TierOf(e.Members, f.writeMax, f.onlineMax) != TierPush {
			continue
		}
		small++
		if !e.HaveRecipients {
			keys = append(keys, store.ConvSeq{Conv: e.Conv, Seq: e.Seq})
			at = append(at, i)
		}
	}
	if small == 0 {
		return
	}
	f.metrics.events.WithLabelValues(TierPush.String()).Add(float64(small))
	ctx, cancel := context.WithTimeout(context.Background(), rowsTimeout)
	defer cancel()
	if len(keys) > 0 {
		rs, err := f.st.Recipients(ctx, keys)
		if err != nil {
			f.log.Debug("reading recipients for rows; delivery reads them again", "err", err)
		} else {
			for j, i := range at {
				evs[i].Recipients, evs[i].HaveRecipients = rs[j], true
			}
		}
	}
	jobs := make([]RowJob, 0, small)
	writes := 0
	for _, e := range evs {
		if e.HaveRecipients && len(e.Recipients) > 0 && TierOf(e.Members, f.writeMax, f.onlineMax) == TierPush {
			jobs = append(jobs, RowJob{Conv: e.Conv, Ts: e.Ts, Users: e.Recipients})
			writes += len(e.Recipients)
		}
	}
	f.metrics.rowWrites.WithLabelValues(TierPush.String()).Add(float64(writes))
	f.rows.Write(ctx, jobs)
}

// queueRows hands the row writes of the push-tier events evs[i], i in at,
// whose recipients delivery read, to the durable row writers.
func (f *Fanout) queueRows(ctx context.Context, evs []eventlog.Committed, recipients [][]string, at []int) {
	if f.rows == nil {
		return
	}
	var jobs []RowJob
	writes := 0
	for _, i := range at {
		if len(recipients[i]) > 0 {
			jobs = append(jobs, RowJob{Conv: evs[i].Conv, Ts: evs[i].Ts, Users: recipients[i]})
			writes += len(recipients[i])
		}
	}
	f.metrics.rowWrites.WithLabelValues(TierPush.String()).Add(float64(writes))
	f.rows.Queue(ctx, jobs)
}

// WireEvent is e as clients see it: the one conversion of a stored event
// into the event map (docs/protocol.md §3), for pushes (PushFrame) and for
// the events of sync and snapshot replies alike, so that every path gives
// an event the same keys. The result shares e's slices.
func WireEvent(e *store.Event) wire.Event {
	return wire.Event{Seq: e.Seq, Kind: e.Kind.String(), Sender: e.Sender, Body: e.Body, Ts: e.Ts,
		Cmid: e.Cmid, Recalled: e.Recalled, Target: e.Target, Users: e.Users, Mentions: e.Mentions, Edited: e.Edited,
		Update: wire.Update{Role: e.Update.Role, MutedUntil: e.Update.MutedUntil, Banned: e.Update.Banned,
			Title: e.Update.Title, Invite: e.Update.Invite}}
}

// PushFrame encodes e as a push frame (WireEvent's event map beside t and
// conv), in one allocation: the frame, which fan-out shares among every
// device the event goes to.
func PushFrame(e store.Event) ([]byte, error) {
	p := wire.Push{T: wire.TPush, Conv: e.Conv, EventFields: WireEvent(&e)}
	// Room for the length prefix, every key, the fixed-size values and
	// the headers of the others (about 230 bytes at most), plus the
	// variable-size values.
	n := 240 + len(e.Conv) + len(e.Sender) + len(e.Cmid) + len(e.Body) + len(e.Update.Role) + len(e.Update.Invite)
	for _, u := range e.Users {
		n += 5 + len(u)
	}
	for _, u := range e.Mentions {
		n += 5 + len(u)
	}
	if e.Update.Title != nil {
		n += 5 + len(*e.Update.Title)
	}
	return p.AppendFrame(make([]byte, 0, n))
}

// Tier is a conversation's fan-out tier (docs/fanout.md), chosen by its
// current member count.
type Tier uint8

// The tiers, smallest conversations first.
const (
	// TierPush: every member's conversation row is written and every
	// online device of a member gets the push (write fan-out).
	TierPush Tier = iota
	// TierOnline: only online members' rows are written and pushed.
	TierOnline
	// TierPull: online devices get the push; no per-member writes.
	TierPull
)

// TierOf is the tier of a conversation with n current members: push below
// writeMax, online up to onlineMax, pull above.
func TierOf(n int64, writeMax, onlineMax int) Tier {
	switch {
	case n < int64(writeMax):
		return TierPush
	case n <= int64(onlineMax):
		return TierOnline
	}
	return TierPull
}

// String is the tier's name on the wire (docs/protocol.md §4 convs.mode)
// and in metrics: "push", "online" or "pull".
func (t Tier) String() string {
	switch t {
	case TierPush:
		return "push"
	case TierOnline:
		return "online"
	}
	return "pull"
}

type userFrame struct {
	user, except string
	users        []string // instead of user: every one of them (ToUsers)
	frame        []byte
}

// ErrBusy: ToUsers dropped a frame because the queue was full.
var ErrBusy = errors.New("fanout: frame queue full; frame dropped")

// ToUsers queues frame for every online device of users, without
// waiting: when the queue is full the frame is dropped (ErrBusy). For
// frames that are best effort by nature (typing, receipts): a burst of
// them must never hold up the requests behind them on a connection.
func (f *Fanout) ToUsers(users []string, frame []byte) error {
	select {
	case f.notes <- userFrame{users: users, frame: frame}:
		return nil
	case <-f.stop:
		return errClosed
	default:
		return ErrBusy
	}
}

// ToUser queues frame for every online device of user except one (e.g.
// read_changed to the user's other devices), on whichever gateways hold
// them. It blocks only while the queue is full, or until ctx is done.
// Frames queued together share one pipelined route lookup; delivery is
// best effort (a failed lookup is logged), and the frame is never dropped
// for a slow device (it is small).
func (f *Fanout) ToUser(ctx context.Context, user, exceptDevice string, frame []byte) error {
	select {
	case f.notes <- userFrame{user: user, except: exceptDevice, frame: frame}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-f.stop:
		return errClosed
	}
}

var errClosed = fmt.Errorf("fanout: closed: %w", backend.ErrUnavailable)

func (f *Fanout) notifyLoop() {
	defer f.wg.Done()
	var batch []userFrame
	for {
		var stopping bool
		select {
		case n := <-f.notes:
			batch = append(batch[:0], n)
		case <-f.stop:
			stopping, batch = true, batch[:0]
		}
	more: // take whatever else is queued (all of it when stopping)
		for stopping || len(batch) < 512 {
			select {
			case n := <-f.notes:
				batch = append(batch, n)
			default:
				break more
			}
		}
		if len(batch) > 0 {
			f.notify(batch)
		}
		if stopping {
			return
		}
	}
}

// relayRouteTTL: how long notifyLoop reuses a user's routes for ToUsers
// frames (typing, receipts). Those are best effort, and a lookup per
// batch was a fifth of parleyd's CPU relaying typing. A connection that
// opens or closes on this gateway drops its user's routes at once
// (RoutesChanged); one that opens on another gateway drops them when
// that gateway's notice arrives on the bus (RoutesMoved, sent before the
// connection's auth is answered), so the TTL bounds only how long a
// closed connection stays a target, which costs a frame its gateway
// drops. ToUser frames (read_changed and the like) always look routes up.
const relayRouteTTL = 5 * time.Second

// relayRoutesMax: cached routes kept before stale ones are swept.
const relayRoutesMax = 200000

type relayRoute struct {
	entries []route.Entry
	at      time.Time
}

// notify delivers a batch of ToUser and ToUsers frames.
func (f *Fanout) notify(batch []userFrame) {
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	now := time.Now()
	users := make([]string, 0, len(batch))
	seen := map[string]bool{}
	byUser := map[string][]route.Entry{}
	for _, n := range batch {
		if n.users == nil && !seen[n.user] {
			seen[n.user] = true
			users = append(users, n.user)
		}
	}
	f.rmu.Lock()
	for _, n := range batch {
		for _, u := range n.users {
			if seen[u] {
				continue
			}
			seen[u] = true
			if r, ok := f.relayRoutes[u]; ok && now.Sub(r.at) < relayRouteTTL {
				byUser[u] = r.entries
			} else {
				users = append(users, u)
			}
		}
	}
	f.looking = len(users) > 0
	f.rmu.Unlock()
	if len(users) > 0 {
		entries, err := f.routes.Lookup(ctx, users)
		if err != nil {
			f.log.Debug("frames to users: route lookup", "users", len(users), "err", err)
			f.keepRelayRoutes(nil, nil, now) // ends the lookup, keeping nothing
			return
		}
		for _, e := range entries {
			byUser[e.User] = append(byUser[e.User], e)
		}
		f.keepRelayRoutes(users, byUser, now)
	}
	perGateway := map[string][]Delivery{}
	for _, n := range batch {
		targets := map[string][]Target{}
		add := func(u string) {
			for _, e := range byUser[u] {
				if e.Device != n.except {
					targets[e.Gateway] = append(targets[e.Gateway], Target{Device: e.Device, Token: e.Token})
				}
			}
		}
		if n.users == nil {
			add(n.user)
		}
		for _, u := range n.users {
			add(u)
		}
		for gw, ts := range targets {
			perGateway[gw] = append(perGateway[gw], Delivery{Frame: n.frame, Targets: ts, Relayed: n.users != nil})
		}
	}
	for gw, ds := range perGateway {
		if gw == f.routes.Gateway() {
			f.local.Deliver(ds)
		} else if err := f.bus.Publish(ctx, gw, ds); err != nil {
			f.log.Debug("frames to users: publish", "gateway", gw, "err", err)
		}
	}
}

// RoutesChanged tells fan-out that a connection of user opened or closed
// on this gateway: the routes it reuses for the user's typing and
// receipts are looked up again.
func (f *Fanout) RoutesChanged(user string) { f.RoutesMoved([]string{user}) }

// RoutesMoved drops the routes reused for users, who connected a device
// on some gateway (the bus's notice of Announce, or this gateway's own).
func (f *Fanout) RoutesMoved(users []string) {
	f.rmu.Lock()
	defer f.rmu.Unlock()
	for _, u := range users {
		if f.looking {
			if f.routeChanged == nil {
				f.routeChanged = map[string]struct{}{}
			}
			f.routeChanged[u] = struct{}{}
		}
		delete(f.relayRoutes, u)
	}
}

// Announce tells every gateway that users just connected a device here
// (their routes are registered), so that the routes they reuse for
// those users' typing and receipts are looked up again (RoutesMoved).
func (f *Fanout) Announce(ctx context.Context, users []string) error {
	if f.bus == nil || len(users) == 0 {
		return nil
	}
	return f.bus.Moved(ctx, users)
}

// keepRelayRoutes ends a lookup: it remembers the routes just looked up
// for users (none for a user without online devices), except those of
// users whose routes changed on this gateway since the batch began (the
// lookup may predate the change). Other users' routes are kept even
// during a reconnect storm. Changes are remembered only during a lookup,
// so the set is empty again whenever none runs.
func (f *Fanout) keepRelayRoutes(users []string, byUser map[string][]route.Entry, now time.Time) {
	f.rmu.Lock()
	defer f.rmu.Unlock()
	if f.relayRoutes == nil {
		f.relayRoutes = map[string]relayRoute{}
	}
	if len(f.relayRoutes)+len(users) > relayRoutesMax {
		for u, r := range f.relayRoutes {
			if now.Sub(r.at) >= relayRouteTTL {
				delete(f.relayRoutes, u)
			}
		}
	}
	for _, u := range users {
		if _, changed := f.routeChanged[u]; !changed {
			f.relayRoutes[u] = relayRoute{entries: byUser[u], at: now}
		}
	}
	f.looking = false
	clear(f.routeChanged)
}
