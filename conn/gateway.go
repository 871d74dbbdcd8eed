// Package conn is Parley's gateway: gnet v2 event loops holding the
// clients' long-lived TCP connections. The event loop only frames and
// decodes (it never blocks on a store); each connection's requests run in
// order on a goroutine that exists only while the connection has work;
// replies and pushes reach the loop through a per-connection outbox, taken
// whole when the loop writes it (so frames queued meanwhile share one
// write), and bounded, so a slow device
// gets a hint instead of pushes, and is disconnected if it stops reading
// altogether.
package conn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gobwas/ws"
	"github.com/panjf2000/gnet/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/conn/proxyheader"
	"github.com/parley-im/parley/conn/wsframe"
	"github.com/parley-im/parley/cursor"
	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/fanout"
	"github.com/parley-im/parley/internal/batch"
	"github.com/parley-im/parley/jwtauth"
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
	// Online adds authenticated connections to the online index of their
	// users' big conversations (nil: none is kept).
	Online func(ctx context.Context, devs []fanout.OnlineDevice) error
	// ToUser relays a frame to the user's online devices but one
	// (read_changed). Not to be confused with Notifications.
	ToUser func(ctx context.Context, user, exceptDevice string, frame []byte) error
	// Notifications are the offline notifications (nil: none configured;
	// notify_register is refused).
	Notifications Notifications
	// ToUsers relays a frame to every online device of users, best
	// effort: it never waits (a frame it cannot queue is dropped). Typing
	// and receipts go this way. Nil: through ToUser, user by user.
	ToUsers func(users []string, frame []byte) error
	// RoutesChanged is told when a connection of user entered or left
	// the route table through this gateway, so that routes ToUsers
	// reuses are looked up again (nil: none are reused, or nobody cares).
	RoutesChanged func(user string)
	// Announce tells every gateway that users' connections just entered
	// the route table here, before their auth is answered, so that the
	// routes other gateways reuse for ToUsers are looked up again (nil:
	// one gateway, or nobody cares).
	Announce func(ctx context.Context, users []string) error
	// Receipts coalesces receipt pushes over gateways (nil: no receipt
	// pushes).
	Receipts *ReceiptGate
	// JWT verifies the tokens of auth {jwt} and refresh (nil: JWT auth is
	// off, and both are answered AUTH_FAILED).
	JWT *jwtauth.Verifier
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
	ran     chan struct{} // closed when Run returns: the engine is down
	eng     gnet.Engine   // set before booted is closed

	authLimit *authLimiter // static; nil when auth_rate is 0

	proxyOn      bool           // proxy_protocol: every connection begins with a PROXY header
	proxyTrusted []netip.Prefix // proxy_trusted
	wsAddr       netip.AddrPort // ws_listen (an unspecified address: any)
	wsOrigins    []string       // ws_origins (nil: any)
	wsUpgrader   ws.Upgrader
	addrs        *addrLimits // static: addr_max_conns, addr_auth_rate
	notices      notices     // recent revocations and suspensions (lifecycle.go)
	// Reads of many connections answered together (combine.go).
	snapshots   batch.Combiner[store.SnapshotQuery, []store.SnapshotItem]
	lookups     batch.Combiner[string, deviceLookup]                 // auth: device id -> row
	provisions  batch.Combiner[store.NewLogin, deviceLookup]         // JWT auth: create the user and device if new
	onlines     batch.Combiner[fanout.OnlineDevice, struct{}]        // auth: join the big conversations' online index
	registers   batch.Combiner[route.Registration, route.Registered] // auth: enter the route table
	disconnects batch.Combiner[route.Disconnected, struct{}]         // close: leave the route table and the online index

	members         memberLists     // current members, for typing and receipts
	receiptQueue    receiptQueue    // reads that moved, waiting to go through the gate together
	pendingReceipts pendingReceipts // receipts waiting for their window

	coalesce      coalescer // sessions with coalesced pushes to flush
	relayCoalesce coalescer // sessions with typing or receipts to flush
	held          heldAcks  // sessions holding rid-less acks (ack_coalesce)

	tickExpired, tickProbe []*Session // OnTick's lists (only the ticker uses them)

	mu       sync.RWMutex
	sessions map[*Session]struct{} // every open connection
	devices  map[string]*Session   // device -> its authenticated connection

	// Tracked goroutines (requests, batches, route cleanup, timers'
	// work): Shutdown waits for them. Guarded by tmu, not a
	// sync.WaitGroup: they are started by event loops, timers and commit
	// workers, which cannot promise that a start from none running
	// happens before Shutdown begins to wait (and the event loops may
	// still run when Shutdown's ctx ends first). Under tmu a start and the
	// wait are always ordered.
	tmu      sync.Mutex
	tracked  int           // tracked goroutines running
	draining bool          // Shutdown waits: once tracked is 0, none starts again
	drained  chan struct{} // closed when tracked reaches 0 while draining

	stopOnce sync.Once
	stopping chan struct{}
}

// New returns a gateway; Run serves it.
func New(cfg config.Config, deps Deps, log *slog.Logger, reg prometheus.Registerer) *Gateway {
	exempt, err := cfg.ExemptPrefixes()
	if err != nil { // Validate refuses such a config
		log.Error("ignoring addr_limit_exempt", "err", err)
	}
	g := &Gateway{
		cfg: cfg, deps: deps, log: log, metrics: newMetrics(reg),
		authLimit: newAuthLimiter(cfg.AuthRate, cfg.AuthBurst),
		addrs:     newAddrLimits(cfg.AddrMaxConns, cfg.AddrAuthRate, cfg.AddrAuthBurst, exempt),
		booted:    make(chan struct{}), ran: make(chan struct{}), stopping: make(chan struct{}),
		sessions: map[*Session]struct{}{}, devices: map[string]*Session{},
	}
	g.members.spawn = g.goroutine
	g.initCombiners()
	g.proxyOn = cfg.ProxyProtocol == "on"
	g.proxyTrusted, _ = cfg.ProxyTrustedPrefixes() // checked by cfg.Validate
	g.wsOrigins = cfg.WSOriginList()
	g.wsUpgrader = g.newWSUpgrader()
	if cfg.WSListen != "" {
		if ap, err := netip.ParseAddrPort(cfg.WSListen); err == nil {
			g.wsAddr = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		} else if _, port, err := net.SplitHostPort(cfg.WSListen); err == nil {
			// A host name: match the port alone.
			p, _ := strconv.ParseUint(port, 10, 16)
			g.wsAddr = netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(p))
		}
	}
	g.coalesce.bit, g.relayCoalesce.bit = pushCoalescer, relayCoalescer
	if cfg.PushCoalesce > 0 {
		g.goroutine(func() { g.every(cfg.PushCoalesce, g.coalesce.flush) })
	}
	if cfg.RelayCoalesce > 0 {
		g.goroutine(func() { g.every(cfg.RelayCoalesce, g.relayCoalesce.flush) })
	}
	if cfg.AckCoalesce > 0 {
		g.goroutine(func() { g.every(cfg.AckCoalesce, g.flushHeldAcks) })
	}
	return g
}

// Run listens on cfg.Listen (and cfg.WSListen, if set) and serves until
// Shutdown. It blocks.
func (g *Gateway) Run() error {
	defer close(g.ran)
	addrs := []string{"tcp://" + g.cfg.Listen}
	if g.cfg.WSListen != "" {
		addrs = append(addrs, "tcp://"+g.cfg.WSListen)
	}
	return gnet.Rotate(g, addrs,
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
		// If ctx ends first, Stop returns while the event loops still
		// run (and may still close connections and start goroutines).
		// Stop polls for the engine's end every 500 ms; Run's return
		// tells it at once.
		stopCtx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-g.ran:
				cancel()
			case <-stopCtx.Done():
			}
		}()
		err = g.eng.Stop(stopCtx)
		cancel()
		select {
		case <-g.ran:
			err = nil
		default:
		}
		select {
		case <-g.drain():
		case <-ctx.Done():
			err = errors.Join(err, ctx.Err())
		}
	})
	return err
}

// goroutine runs f on a tracked goroutine: Shutdown waits for it. Once
// Shutdown has seen every tracked goroutine end, f is not run at all (the
// server is closing the stores it would use).
func (g *Gateway) goroutine(f func()) {
	g.tmu.Lock()
	if g.draining && g.tracked == 0 {
		g.tmu.Unlock()
		return
	}
	g.tracked++
	g.tmu.Unlock()
	go func() {
		defer g.untrack()
		f()
	}()
}

// untrack ends a tracked goroutine.
func (g *Gateway) untrack() {
	g.tmu.Lock()
	g.tracked--
	if g.tracked == 0 && g.draining {
		close(g.drained)
	}
	g.tmu.Unlock()
}

// drain stops tracked goroutines from starting once none runs, and
// returns a channel closed when none runs any more.
func (g *Gateway) drain() <-chan struct{} {
	g.tmu.Lock()
	defer g.tmu.Unlock()
	if !g.draining {
		g.draining = true
		g.drained = make(chan struct{})
		if g.tracked == 0 {
			close(g.drained)
		}
	}
	return g.drained
}

// isWS reports whether c came in on the WebSocket listener.
func (g *Gateway) isWS(c gnet.Conn) bool {
	if !g.wsAddr.IsValid() {
		return false
	}
	local, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok || local.Port != int(g.wsAddr.Port()) {
		return false
	}
	if g.wsAddr.Addr().IsUnspecified() {
		return true
	}
	return addrOf(local) == g.wsAddr.Addr()
}

// trusted reports whether a is a proxy in proxy_trusted.
func (g *Gateway) trusted(a netip.Addr) bool {
	for _, p := range g.proxyTrusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// OnOpen registers the session. With proxy_protocol on, a connection from
// an address outside proxy_trusted is closed at once.
func (g *Gateway) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	select {
	case <-g.stopping:
		return nil, gnet.Close
	default:
	}
	peer := addrOf(c.RemoteAddr())
	if g.proxyOn && !g.trusted(peer) {
		g.metrics.proxy.WithLabelValues("untrusted").Inc()
		g.log.Debug("connection from an untrusted proxy refused", "addr", peer)
		return nil, gnet.Close
	}
	s := newSession(g, c, peer, g.isWS(c)) // addr: the peer's, until a PROXY header names the client's
	c.SetContext(s)
	g.mu.Lock()
	g.sessions[s] = struct{}{}
	g.mu.Unlock()
	g.metrics.connections.Inc()
	if !g.proxyOn {
		// The peer is the client: count it now. Behind a proxy the
		// client's address is known only once the header is read, and the
		// connection is counted under it at its first frame (request).
		g.countAddr(s)
	}
	return nil, gnet.None
}

// countAddr counts the connection under its client address (addr_max_conns),
// moving it from the address it was counted under before, if that
// changed. Over the limit, the connection is refused (RATE_LIMITED, and
// closed) and it returns false. Runs on the event loop.
func (g *Gateway) countAddr(s *Session) bool {
	if s.counted == s.addr {
		return true
	}
	g.addrs.close(s.counted)
	var ok bool
	if s.counted, ok = g.addrs.open(s.addr); ok {
		return true
	}
	g.metrics.refusals.WithLabelValues("addr_conns").Inc()
	g.metrics.errors.WithLabelValues(string(wire.RateLimited)).Inc()
	s.fail("", &wire.Error{Code: wire.RateLimited, RetryAfterMs: 1000,
		Msg: fmt.Sprintf("this address holds %d connections, addr_max_conns", g.cfg.AddrMaxConns)})
	return false
}

// OnClose unregisters the session and its route.
func (g *Gateway) OnClose(c gnet.Conn, _ error) gnet.Action {
	s, ok := c.Context().(*Session)
	if !ok {
		return gnet.None
	}
	s.closed.Store(true)
	if s.needsProxy && !s.closing.Load() {
		// Closed (by the peer, or by auth_timeout) before a complete header.
		reason := "missing"
		if s.inbound > 0 {
			reason = "truncated"
		}
		g.metrics.proxy.WithLabelValues(reason).Inc()
	} else if s.ws != nil && !s.ws.upgraded && s.inbound > 0 && !s.closing.Load() {
		g.metrics.wsHandshakes.WithLabelValues("truncated").Inc()
	}
	s.stopExpiry()
	g.addrs.close(s.counted)
	s.counted = netip.Addr{}
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
			ctx, cancel := context.WithTimeout(context.Background(), g.cfg.RequestTimeout)
			defer cancel()
			if _, err := g.disconnects.Do(ctx, route.Disconnected{User: s.user, Device: s.device, Token: s.token}); err != nil {
				g.log.Debug("leaving the route table and the online index", "device", s.device, "err", err)
			}
			g.routesChanged(s.user)
		})
	}
	return gnet.None
}

// OnTraffic reads the PROXY header (proxy_protocol) and the WebSocket
// handshake (ws_listen) if they are due, then frames and decodes every
// complete frame in the buffer.
func (g *Gateway) OnTraffic(c gnet.Conn) gnet.Action {
	s := c.Context().(*Session)
	// Only new bytes are activity: probe's Wake calls OnTraffic too, and
	// must not keep a device that stopped reading and sending alive.
	now := time.Now() // when the frames read now arrived
	if c.InboundBuffered() > s.inbound {
		s.lastSeen.Store(now.UnixNano())
	}
	defer func() { s.inbound = c.InboundBuffered() }()
	if s.closing.Load() {
		// Refused or kicked: nothing more is read from this connection
		// (an auth sent after the refusal must not authenticate it).
		_, _ = c.Discard(c.InboundBuffered())
		return gnet.None
	}
	if s.needsProxy {
		if done, act := g.readProxyHeader(s, c); !done {
			return act
		}
	}
	if s.ws != nil {
		return g.wsTraffic(s, c, now)
	}
	for {
		n := c.InboundBuffered()
		if s.closing.Load() {
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
		stop := g.request(s, body, now) // decodes and copies what it keeps
		_, _ = c.Discard(consumed)
		if stop {
			return gnet.None
		}
	}
}

// readProxyHeader reads the PROXY header at the start of the inbound
// bytes, once complete, and takes the client's address from it. done is
// false while it is incomplete or after it was refused (act then says what
// to do with the connection).
func (g *Gateway) readProxyHeader(s *Session, c gnet.Conn) (done bool, act gnet.Action) {
	buf, _ := c.Peek(c.InboundBuffered())
	n, err := proxyheader.Len(buf)
	if err == nil && n == 0 {
		return false, gnet.None
	}
	var addr netip.Addr
	if err == nil {
		addr, err = proxyheader.Parse(buf[:n], s.addr)
	}
	if err != nil {
		reason := "malformed"
		if errors.Is(err, proxyheader.ErrMissing) {
			reason = "missing"
		}
		g.metrics.proxy.WithLabelValues(reason).Inc()
		g.log.Debug("PROXY header refused", "proxy", s.addr, "err", err)
		s.closing.Store(true)
		_, _ = c.Discard(len(buf))
		return false, gnet.Close
	}
	_, _ = c.Discard(n)
	g.metrics.proxy.WithLabelValues("ok").Inc()
	s.addr = addr
	s.needsProxy = false
	if s.ws == nil {
		s.framing.Store(true)
	}
	return true, gnet.None
}

// wsTraffic reads a WebSocket connection: the upgrade request first, then
// frames. Control frames are answered here on the loop; each complete
// binary message is one request.
func (g *Gateway) wsTraffic(s *Session, c gnet.Conn, now time.Time) gnet.Action {
	if !s.ws.upgraded {
		buf, _ := c.Peek(c.InboundBuffered())
		n := wsframe.HandshakeLen(buf)
		if n == 0 {
			return gnet.None
		}
		if n < 0 {
			g.metrics.wsHandshakes.WithLabelValues("too_large").Inc()
			s.closing.Store(true)
			_, _ = c.Write([]byte("HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"))
			return gnet.Close
		}
		reason, ok := g.wsUpgrade(buf[:n], func(resp []byte) { _, _ = c.Write(resp) })
		_, _ = c.Discard(n)
		if !ok {
			g.metrics.wsHandshakes.WithLabelValues(reason).Inc()
			g.log.Debug("WebSocket handshake refused", "addr", s.addr, "reason", reason)
			s.closing.Store(true)
			return gnet.Close
		}
		g.metrics.wsHandshakes.WithLabelValues("ok").Inc()
		s.ws.upgraded = true
		s.framing.Store(true)
	}
	for {
		n := c.InboundBuffered()
		if s.closing.Load() {
			_, _ = c.Discard(n)
			return gnet.None
		}
		if n < 2 {
			return gnet.None
		}
		buf, err := c.Peek(n)
		if err != nil {
			return gnet.None
		}
		ev, consumed, werr := s.ws.reader.Next(buf, g.cfg.MaxFrame)
		if werr != nil {
			g.metrics.wsErrors.WithLabelValues(werr.Reason).Inc()
			g.metrics.framesIn.WithLabelValues("invalid").Inc()
			_, _ = c.Discard(n)
			if werr.Code == ws.StatusMessageTooBig {
				// As on TCP: an oversized message gets TOO_LARGE, then
				// the close.
				s.fail("", wire.Errorf(wire.TooLarge, "%s", werr.Msg))
				return gnet.None
			}
			s.wsFail(werr.Code)
			return gnet.None
		}
		if consumed == 0 {
			return gnet.None
		}
		stop := false
		switch ev.Kind {
		case wsframe.Binary:
			stop = g.request(s, ev.Payload, now)
		case wsframe.Text:
			g.metrics.wsErrors.WithLabelValues("text").Inc()
			g.metrics.framesIn.WithLabelValues("invalid").Inc()
			if !s.gotFirst {
				s.fail("", wire.Errorf(wire.Unauthenticated, "the first frame must be auth"))
				stop = true
			} else {
				g.metrics.errors.WithLabelValues(string(wire.BadFrame)).Inc()
				s.reply(wire.ErrorReply("", wire.Errorf(wire.BadFrame, "text message: frames travel in binary messages")))
			}
		case wsframe.Ping:
			_, _ = c.Write(wsframe.AppendControl(nil, ws.OpPong, ev.Payload))
		case wsframe.Close:
			code := ev.Code
			if code == ws.StatusNoStatusRcvd { // no code: answer with a normal closure
				code = ws.StatusNormalClosure
			}
			s.wsFail(code)
			stop = true
		}
		_, _ = c.Discard(consumed)
		if stop {
			return gnet.None
		}
	}
}

// request decodes one frame body and handles it: on the loop (ping, and
// the refusals before auth) or by queueing it for the session's request
// goroutine. stop: the connection is closing, read no further.
func (g *Gateway) request(s *Session, body []byte, now time.Time) (stop bool) {
	req, derr := wire.DecodeRequest(body) // copies what it keeps
	if derr != nil {
		we, _ := wire.AsError(derr)
		g.metrics.framesIn.WithLabelValues("invalid").Inc()
		if !s.gotFirst && req.T != wire.TAuth {
			// Before auth, any frame but an auth closes the
			// connection, one that does not even decode too.
			s.fail(req.Rid, wire.Errorf(wire.Unauthenticated, "the first frame must be auth"))
			return true
		}
		s.reply(wire.ErrorReply(req.Rid, we))
		return false
	}
	g.metrics.framesIn.WithLabelValues(req.T).Inc()
	if req.T == wire.TPing && s.answered.Load() {
		s.reply(wire.Pong{T: wire.TPong, Rid: req.Rid, Ts: time.Now().UnixMilli()})
		return false
	}
	if req.T == wire.TTyping && s.answered.Load() && g.typingOnLoop(s, &req, now) {
		return false
	}
	// Below: frames before auth succeeded. Nothing but auth may come
	// first; what is pipelined behind an auth is queued behind it and
	// runs only if it succeeds (a ping too: its pong then follows
	// auth_ok).
	if !s.gotFirst {
		s.gotFirst = true
		if req.T != wire.TAuth {
			s.fail(req.Rid, wire.Errorf(wire.Unauthenticated, "the first frame must be auth"))
			return true
		}
		// The client's address is final now (after any PROXY protocol
		// header): count the connection under it.
		if !g.countAddr(s) {
			return true
		}
		// The address's auth rate, then the gateway's, checked here on
		// the loop: a refused auth costs no goroutine and no database
		// lookup, and one address cannot use up the gateway's rate.
		if wait, ok := g.addrs.admitAuth(s.addr, now); !ok {
			g.metrics.refusals.WithLabelValues("addr_auth_rate").Inc()
			g.metrics.errors.WithLabelValues(string(wire.RateLimited)).Inc()
			s.fail(req.Rid, &wire.Error{Code: wire.RateLimited, RetryAfterMs: wait.Milliseconds(),
				Msg: "too many auths from this address; reconnect after retry_after_ms"})
			return true
		}
		if wait, ok := g.authLimit.admit(time.Now()); !ok {
			g.metrics.refusals.WithLabelValues("auth_rate").Inc()
			g.metrics.errors.WithLabelValues(string(wire.RateLimited)).Inc()
			s.fail(req.Rid, &wire.Error{Code: wire.RateLimited, RetryAfterMs: wait.Milliseconds(),
				Msg: "too many devices are authenticating at this gateway; reconnect after retry_after_ms"})
			return true
		}
	} else if req.T == wire.TAuth {
		s.reply(wire.ErrorReply(req.Rid, wire.Errorf(wire.BadRequest, "already authenticated")))
		return false
	}
	s.enqueue(req, now)
	return false
}

// OnTick enforces auth_timeout and idle_timeout, probes slow devices that
// owe hints, and runs the redelivery scan.
func (g *Gateway) OnTick() (time.Duration, gnet.Action) {
	now := time.Now()
	// The tick's lists are kept from tick to tick: built anew, they were
	// a slice of every session per second, garbage that raised the
	// resident memory of a gateway holding many idle connections.
	expired, probe := g.tickExpired[:0], g.tickProbe[:0]
	defer func() { // drop the references, keep the room
		clear(expired)
		clear(probe)
		g.tickExpired, g.tickProbe = expired[:0], probe[:0]
	}()
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
	g.addrs.prune(now)
	g.notices.prune(now)
	for _, s := range expired {
		if !s.framing.Load() {
			// Still no complete PROXY header or WebSocket handshake:
			// nothing to say in frames (OnClose counts it).
			s.close()
			continue
		}
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

// Backlogged reports whether more than authBatch connections are not
// authenticated yet, or, within the last second, an auth or a snapshot
// had to wait for a statement because every worker of its kind was busy
// (fanout.Local): a reconnect storm, from its first connections.
func (g *Gateway) Backlogged() bool {
	since := time.Now().Add(-time.Second)
	if g.snapshots.Waited().After(since) || g.lookups.Waited().After(since) || g.provisions.Waited().After(since) {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.sessions)-len(g.devices) > authBatch
}

// Deliver writes frames to this gateway's connections (fanout.Local).
func (g *Gateway) Deliver(ds []fanout.Delivery) {
	now := time.Now()
	pushes := 0
	g.mu.RLock()
	for _, d := range ds {
		for _, t := range d.Targets {
			s := g.devices[t.Device]
			switch {
			case s == nil:
			case !s.answered.Load():
				// Registered, auth_ok not queued yet: the snapshot the
				// client makes after auth_ok finds what was committed
				// before this push, and nothing may precede auth_ok.
			case d.Relayed:
				s.relay(d.Frame)
			default:
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
	fail := func(n int, err error) {
		failed += n
		if firstErr == nil {
			firstErr = err
		}
	}
	var online []fanout.OnlineDevice
	for chunk := range slices.Chunk(ss, authBatch) {
		rs := make([]route.Registration, len(chunk))
		for i, s := range chunk {
			rs[i] = route.Registration{User: s.user, Device: s.device, Token: s.token}
		}
		for i, r := range g.deps.Routes.RegisterMany(ctx, rs) {
			s := chunk[i]
			switch {
			case errors.Is(r.Err, route.ErrFenced):
				s.kickOut("replaced")
			case r.Err != nil:
				fail(1, r.Err)
			default:
				online = append(online, fanout.OnlineDevice{User: s.user, Device: s.device, Token: s.token})
			}
		}
	}
	for len(online) > 0 && g.deps.Online != nil {
		n := min(len(online), authBatch)
		if err := g.deps.Online(ctx, online[:n]); err != nil {
			fail(n, err)
		}
		online = online[n:]
	}
	if failed > 0 {
		g.log.Warn("re-registering routes", "connections", len(ss), "failed", failed, "err", firstErr)
		return fmt.Errorf("re-registering %d of %d connections: %w", failed, len(ss), firstErr)
	}
	g.log.Info("re-registered routes after Redis lost them", "connections", len(ss))
	return nil
}

// routesChanged tells fan-out that user's routes changed (Deps.RoutesChanged).
func (g *Gateway) routesChanged(user string) {
	if g.deps.RoutesChanged != nil {
		g.deps.RoutesChanged(user)
	}
}

// addrOf returns the IP of a socket address (the zero Addr if it has none).
func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.TCPAddr:
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap()
		}
	case nil:
	default:
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			return ap.Addr().Unmap()
		}
	}
	return netip.Addr{}
}
