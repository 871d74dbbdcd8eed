// Package conn is Parley's gateway: gnet v2 event loops holding the
// clients' long-lived TCP connections. The event loop only frames and
// decodes (it never blocks on a store); each connection's requests run in
// order on a goroutine that exists only while the connection has work;
// replies and pushes reach the loop through a per-connection outbox that
// coalesces frames into one AsyncWrite and is bounded, so a slow device
// gets a hint instead of pushes, and is disconnected if it stops reading
// altogether.
package conn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/cursor"
	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/fanout"
	"github.com/parley-im/parley/route"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/wire"
)

// Deps are the stores and services the gateway uses.
type Deps struct {
	Store   *store.Store
	Log     *eventlog.Log
	Cursors *cursor.Cursors
	Routes  *route.Table
	Bus     *fanout.Bus
	// Rows are the users' conversation rows (the order of convs); nil:
	// convs probes every conversation.
	Rows *fanout.Rows
	// Mentions limits mention_all sends (nil: unlimited).
	Mentions *MentionLimiter
	// Online adds an authenticated connection to the online index of the
	// user's big conversations (nil: none is kept).
	Online func(ctx context.Context, user, device string, token int64) error
	// Notify sends a frame to the user's online devices but one.
	Notify func(ctx context.Context, user, exceptDevice string, frame []byte) error
	// Notifications are the offline notifications (nil: none configured;
	// notify_register is refused).
	Notifications Notifications
	// NotifyMany sends a frame to every online device of users, best
	// effort: it never waits (a frame it cannot queue is dropped). Typing
	// and receipts go this way. Nil: through Notify, user by user.
	NotifyMany func(users []string, frame []byte) error
	// Receipts coalesces receipt pushes over gateways (nil: no receipt
	// pushes).
	Receipts *ReceiptGate
}

// Gateway is the gnet event handler and the registry of its sessions.
type Gateway struct {
	gnet.BuiltinEventEngine

	// Static after construction.
	cfg     config.Config
	deps    Deps
	log     *slog.Logger
	metrics *metrics
	booted  chan struct{}
	eng     gnet.Engine // set before booted is closed

	authLimit *authLimiter // static; nil when auth_rate is 0
	// Reads of many connections answered together (combine.go).
	snapshots combiner[store.SnapshotQuery, []store.SnapshotItem]
	lookups   combiner[string, deviceLookup] // auth: device id -> row

	members         memberLists     // current members, for typing and receipts
	pendingReceipts pendingReceipts // receipts waiting for their window

	coalesce coalescer // sessions with coalesced pushes to flush
	held     heldAcks  // sessions holding rid-less acks (ack_coalesce)

	mu       sync.RWMutex
	sessions map[*Session]struct{} // every open connection
	devices  map[string]*Session   // device -> its authenticated connection

	wg       sync.WaitGroup // request goroutines
	stopOnce sync.Once
	stopping chan struct{}
}

// New returns a gateway; Run serves it.
func New(cfg config.Config, deps Deps, log *slog.Logger, reg prometheus.Registerer) *Gateway {
	g := &Gateway{
		cfg: cfg, deps: deps, log: log, metrics: newMetrics(reg),
		authLimit: newAuthLimiter(cfg.AuthRate, cfg.AuthBurst),
		booted:    make(chan struct{}), stopping: make(chan struct{}),
		sessions: map[*Session]struct{}{}, devices: map[string]*Session{},
	}
	g.members.st = deps.Store
	g.initCombiners()
	if cfg.PushCoalesce > 0 {
		g.goroutine(func() { g.every(cfg.PushCoalesce, g.coalesce.flush) })
	}
	if cfg.AckCoalesce > 0 {
		g.goroutine(func() { g.every(cfg.AckCoalesce, g.flushHeldAcks) })
	}
	return g
}

// Run listens on cfg.Listen and serves until Shutdown. It blocks.
func (g *Gateway) Run() error {
	return gnet.Run(g, "tcp://"+g.cfg.Listen,
		gnet.WithMulticore(g.cfg.Multicore),
		gnet.WithTicker(true),
		gnet.WithReusePort(false),
		// A restart must be able to bind while the kicked connections sit in TIME_WAIT.
		gnet.WithReuseAddr(true),
		gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithTCPKeepAlive(time.Minute),
		gnet.WithReadBufferCap(4096),
		gnet.WithWriteBufferCap(4096),
		gnet.WithLogger(gnetLogger{g.log}),
	)
}

// Booted is closed once the gateway accepts connections.
func (g *Gateway) Booted() <-chan struct{} { return g.booted }

// OnBoot publishes the engine.
func (g *Gateway) OnBoot(eng gnet.Engine) gnet.Action {
	g.eng = eng
	close(g.booted)
	return gnet.None
}

// Shutdown kicks every client ("shutdown"), stops the engine and waits for
// running requests (bounded by ctx). Safe to call twice.
func (g *Gateway) Shutdown(ctx context.Context) error {
	var err error
	g.stopOnce.Do(func() {
		close(g.stopping)
		select {
		case <-g.booted:
		default:
			return
		}
		g.mu.RLock()
		for s := range g.sessions {
			s.kickOut("shutdown")
		}
		g.mu.RUnlock()
		// Give the kicks a moment to reach the clients.
		deadline := time.Now().Add(500 * time.Millisecond)
		// (Not eng.CountConnections: gnet registers its loops after OnBoot,
		// so it races with a Shutdown right after Start.)
		for time.Now().Before(deadline) && g.Sessions() > 0 {
			time.Sleep(20 * time.Millisecond)
		}
		err = g.eng.Stop(ctx)
		done := make(chan struct{})
		go func() { g.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			err = errors.Join(err, ctx.Err())
		}
	})
	return err
}

// goroutine runs f on a tracked goroutine (Shutdown waits for them).
func (g *Gateway) goroutine(f func()) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f()
	}()
}

// OnOpen registers the session.
func (g *Gateway) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	select {
	case <-g.stopping:
		return nil, gnet.Close
	default:
	}
	s := newSession(g, c)
	c.SetContext(s)
	g.mu.Lock()
	g.sessions[s] = struct{}{}
	g.mu.Unlock()
	g.metrics.connections.Inc()
	return nil, gnet.None
}

// OnClose unregisters the session and its route.
func (g *Gateway) OnClose(c gnet.Conn, _ error) gnet.Action {
	s, ok := c.Context().(*Session)
	if !ok {
		return gnet.None
	}
	s.closed.Store(true)
	g.mu.Lock()
	delete(g.sessions, s)
	if s.authed.Load() && g.devices[s.device] == s {
		delete(g.devices, s.device)
	}
	g.mu.Unlock()
	g.metrics.connections.Dec()
	if s.authed.Load() {
		g.goroutine(func() {
			s.flushAcks(nil) // the acks it held still count
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := g.deps.Routes.Unregister(ctx, s.user, s.device, s.token); err != nil {
				g.log.Debug("unregistering route", "device", s.device, "err", err)
			}
			if err := g.deps.Routes.RemoveOnline(ctx, s.device, s.token); err != nil {
				g.log.Debug("leaving the online index", "device", s.device, "err", err)
			}
		})
	}
	return gnet.None
}

// OnTraffic frames and decodes every complete frame in the buffer.
func (g *Gateway) OnTraffic(c gnet.Conn) gnet.Action {
	s := c.Context().(*Session)
	// Only new bytes are activity: probe's Wake calls OnTraffic too, and
	// must not keep a device that stopped reading and sending alive.
	now := time.Now() // when the frames read now arrived
	if c.InboundBuffered() > s.inbound {
		s.lastSeen.Store(now.UnixNano())
	}
	defer func() { s.inbound = c.InboundBuffered() }()
	for {
		n := c.InboundBuffered()
		if s.closing.Load() {
			// Refused or kicked: nothing more is read from this connection
			// (an auth sent after the refusal must not authenticate it).
			_, _ = c.Discard(n)
			return gnet.None
		}
		if n < wire.HeaderLen {
			return gnet.None
		}
		buf, err := c.Peek(n)
		if err != nil {
			return gnet.None
		}
		body, consumed, ferr := wire.NextFrame(buf, g.cfg.MaxFrame)
		if ferr != nil {
			// The framing is broken: say why and close.
			we, _ := wire.AsError(ferr)
			g.metrics.framesIn.WithLabelValues("invalid").Inc()
			s.fail("", we)
			_, _ = c.Discard(n)
			return gnet.None
		}
		if body == nil {
			return gnet.None
		}
		req, derr := wire.DecodeRequest(body) // copies what it keeps
		_, _ = c.Discard(consumed)
		if derr != nil {
			we, _ := wire.AsError(derr)
			g.metrics.framesIn.WithLabelValues("invalid").Inc()
			if !s.gotFirst && req.T != wire.TAuth {
				// Before auth, any frame but an auth closes the
				// connection, one that does not even decode too.
				s.fail(req.Rid, wire.Errorf(wire.Unauthenticated, "the first frame must be auth"))
				return gnet.None
			}
			s.reply(wire.ErrorReply(req.Rid, we))
			continue
		}
		g.metrics.framesIn.WithLabelValues(req.T).Inc()
		if req.T == wire.TPing && s.authed.Load() {
			s.reply(wire.Pong{T: wire.TPong, Rid: req.Rid, Ts: time.Now().UnixMilli()})
			continue
		}
		// Below: frames before auth succeeded. Nothing but auth may come
		// first; what is pipelined behind an auth is queued behind it and
		// runs only if it succeeds (a ping too: its pong then follows
		// auth_ok).
		if !s.gotFirst {
			s.gotFirst = true
			if req.T != wire.TAuth {
				s.fail(req.Rid, wire.Errorf(wire.Unauthenticated, "the first frame must be auth"))
				return gnet.None
			}
			// The gateway's auth rate, checked here on the loop: a refused
			// auth costs no goroutine and no database lookup.
			if wait, ok := g.authLimit.admit(time.Now()); !ok {
				g.metrics.refusals.WithLabelValues("auth_rate").Inc()
				g.metrics.errors.WithLabelValues(string(wire.RateLimited)).Inc()
				s.fail(req.Rid, &wire.Error{Code: wire.RateLimited, RetryAfterMs: wait.Milliseconds(),
					Msg: "too many devices are authenticating at this gateway; reconnect after retry_after_ms"})
				return gnet.None
			}
		} else if req.T == wire.TAuth {
			s.reply(wire.ErrorReply(req.Rid, wire.Errorf(wire.BadRequest, "already authenticated")))
			continue
		}
		s.enqueue(req, now)
	}
}

// OnTick enforces auth_timeout and idle_timeout, probes slow devices that
// owe hints, and runs the redelivery scan.
func (g *Gateway) OnTick() (time.Duration, gnet.Action) {
	now := time.Now()
	var expired, probe []*Session
	g.mu.RLock()
	for s := range g.sessions {
		last := time.Unix(0, s.lastSeen.Load())
		switch {
		case !s.authed.Load() && now.Sub(s.opened) > g.cfg.AuthTimeout:
			expired = append(expired, s)
		case now.Sub(last) > g.cfg.IdleTimeout:
			expired = append(expired, s)
		default:
			probe = append(probe, s)
		}
	}
	g.mu.RUnlock()
	for _, s := range expired {
		if !s.authed.Load() {
			s.fail("", wire.Errorf(wire.Unauthenticated, "no auth within %s", g.cfg.AuthTimeout))
		} else {
			s.close()
		}
	}
	for _, s := range probe {
		s.probe()
		s.redeliver(now)
	}
	return time.Second, gnet.None
}

// Deliver writes frames to this gateway's connections (fanout.Local).
func (g *Gateway) Deliver(ds []fanout.Delivery) {
	now := time.Now()
	pushes := 0
	g.mu.RLock()
	for _, d := range ds {
		for _, t := range d.Targets {
			if s := g.devices[t.Device]; s != nil {
				s.push(d.Frame, d.Conv, d.Seq, d.Coalesce, now)
				pushes++
			}
		}
	}
	g.mu.RUnlock()
	g.metrics.pushesOut.Add(float64(pushes))
}

// Kick closes the device's connection if it is the one with t.Token (a
// newer connection of the device registered on another gateway).
func (g *Gateway) Kick(t fanout.Target) {
	g.mu.RLock()
	s := g.devices[t.Device]
	g.mu.RUnlock()
	if s != nil && s.token == t.Token {
		s.kickOut("replaced")
	}
}

// Sessions returns how many connections are open.
func (g *Gateway) Sessions() int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return len(g.sessions)
}

type gnetLogger struct{ l *slog.Logger }

func (g gnetLogger) Debugf(f string, a ...any) {}
func (g gnetLogger) Infof(f string, a ...any)  {}
func (g gnetLogger) Warnf(f string, a ...any)  { g.l.Warn("gnet", "msg", fmt.Sprintf(f, a...)) }
func (g gnetLogger) Errorf(f string, a ...any) { g.l.Error("gnet", "msg", fmt.Sprintf(f, a...)) }
func (g gnetLogger) Fatalf(f string, a ...any) { g.l.Error("gnet fatal", "msg", fmt.Sprintf(f, a...)) }

// Reregister writes the routing entry (and online-index entries) of every
// authenticated connection again, with its own fencing token (after Redis
// lost them). A connection that fails does not stop the others; the
// error says how many failed, for the caller to try again.
func (g *Gateway) Reregister(ctx context.Context) error {
	g.mu.RLock()
	ss := make([]*Session, 0, len(g.devices))
	for _, s := range g.devices {
		ss = append(ss, s)
	}
	g.mu.RUnlock()
	failed := 0
	var firstErr error
	for _, s := range ss {
		_, _, err := g.deps.Routes.Register(ctx, s.user, s.device, s.token)
		if errors.Is(err, route.ErrFenced) {
			s.kickOut("replaced")
			continue
		}
		if err == nil && g.deps.Online != nil {
			err = g.deps.Online(ctx, s.user, s.device, s.token)
		}
		if err != nil {
			failed++
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	if failed > 0 {
		g.log.Warn("re-registering routes", "connections", len(ss), "failed", failed, "err", firstErr)
		return fmt.Errorf("re-registering %d of %d connections: %w", failed, len(ss), firstErr)
	}
	g.log.Info("re-registered routes after Redis lost them", "connections", len(ss))
	return nil
}
