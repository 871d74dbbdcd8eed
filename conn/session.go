package conn

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/panjf2000/gnet/v2"

	"github.com/parley-im/parley/conn/wsframe"
	"github.com/parley-im/parley/cursor"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/wire"
)

// maxQueued is how many requests of one connection may wait for the
// request goroutine before the connection is told RATE_LIMITED.
const maxQueued = 256

// Session is the state of one client connection.
type Session struct {
	// Static after construction.
	g      *Gateway
	c      gnet.Conn
	id     uint64 // keeps this connection's acks in order in their commit queue
	opened time.Time
	ws     *wsConn // the WebSocket state; nil on the TCP listener

	// addr is the client's address: the peer's, or the one a trusted
	// proxy's PROXY header names. Written by the event loop before the
	// first frame is read (OnOpen, then the header); read-only after.
	addr netip.Addr

	// Owned by the event loop.
	gotFirst   bool // the first frame (which must be auth) arrived
	inbound    int  // bytes left unread in gnet's inbound buffer after OnTraffic
	needsProxy bool // the PROXY header has not arrived yet

	// framing: the PROXY header and the WebSocket handshake are behind
	// us, frames may be written (before, a final frame just closes).
	framing atomic.Bool
	counted netip.Addr // the address this connection counts under in addr_max_conns (invalid: none)

	// Written once by the auth handler before authed is set; read-only after.
	user   string
	device string
	epoch  int64
	token  int64 // fencing token of this connection's routing entry
	jwt    bool  // authenticated by a JWT (it expires; refresh extends it)
	authed atomic.Bool
	// answered: auth_ok is queued. Only from then on may the loop answer
	// a frame itself (ping, typing): one pipelined behind the auth, read
	// while the auth still joined the online index, would otherwise be
	// answered before auth_ok. Deliveries (pushes, hints, relayed
	// frames) skip the session until then too.
	answered atomic.Bool

	// JWT expiry: unix ms of exp (0: never), and the timer that kicks the
	// connection then. Guarded by emu.
	expiresAt atomic.Int64
	emu       sync.Mutex
	expTimer  *time.Timer

	lastSeen atomic.Int64 // unix nanos of the last frame received
	closed   atomic.Bool
	closing  atomic.Bool // fail or kickOut queued the last frame: ignore input

	// Request queue, drained by one goroutine at a time (requests of one
	// connection are handled in order; idle connections hold none).
	qmu     sync.Mutex
	queue   []*queued
	running bool

	// Outbox: frames waiting for the event loop. Guarded by omu.
	omu        sync.Mutex
	out        []byte
	spare      []byte
	scheduled  bool               // flushOnLoop is queued on the loop (or running)
	flushFn    gnet.AsyncCallback // s.flushOnLoop, made once
	coalescing uint8              // the coalescers (their bits) s is queued in for a flush
	behind     map[string]int64   // conv -> newest seq dropped for this slow device: owes a hint
	kick       bool               // close once the outbox is written
	backlog    int                // bytes gnet still held at the last flush

	redelivery redelivery // guarded by omu
	// known: conv -> the newest seq this connection was pushed or given
	// (send_ok, sync, convs, snapshot). Guarded by omu. Such a seq is
	// committed and the user is, or was, a member, so an ack up to it
	// needs neither the membership nor the head check in PostgreSQL (see
	// Gateway.ack), and one without rid is held (heldacks.go).
	known map[string]int64

	// held: conv -> the newest rid-less ack held for ack_coalesce
	// (heldacks.go). Guarded by amu.
	amu  sync.Mutex
	held map[string]cursor.Ack

	sendTokens float64 // send rate limiter, guarded by qmu (only the request goroutine uses it)
	sendLast   time.Time
	typingLast map[string]time.Time // conv -> last typing relayed; guarded by qmu
}

// queued is a request waiting for the session's request goroutine, and
// when it arrived.
type queued struct {
	req wire.Request
	at  time.Time
}

var sessionIDs atomic.Uint64

func newSession(g *Gateway, c gnet.Conn, addr netip.Addr, ws bool) *Session {
	now := time.Now()
	s := &Session{g: g, c: c, opened: now, id: sessionIDs.Add(1), addr: addr}
	s.flushFn = s.flushOnLoop
	if ws {
		s.ws = &wsConn{}
	}
	s.needsProxy = g.proxyOn
	s.framing.Store(!s.needsProxy && !ws)
	s.lastSeen.Store(now.UnixNano())
	return s
}

// enqueue hands req, which arrived at at, to the session's request
// goroutine, starting one if none runs.
func (s *Session) enqueue(req wire.Request, at time.Time) {
	s.qmu.Lock()
	if len(s.queue) >= maxQueued {
		s.qmu.Unlock()
		s.reply(wire.ErrorReply(req.Rid, &wire.Error{Code: wire.RateLimited, Msg: "too many requests in flight", RetryAfterMs: 100}))
		return
	}
	// Each request is allocated once, here: the handlers keep a pointer
	// to it (replies after a commit), so drain passes this one on rather
	// than a copy of its own.
	s.queue = append(s.queue, &queued{req, at})
	if s.running {
		s.qmu.Unlock()
		return
	}
	s.running = true
	s.qmu.Unlock()
	s.g.goroutine(s.drain)
}

func (s *Session) drain() {
	for {
		s.qmu.Lock()
		if len(s.queue) == 0 || s.closed.Load() || s.closing.Load() {
			s.queue = nil
			s.running = false
			s.qmu.Unlock()
			return
		}
		q := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		s.qmu.Unlock()
		s.g.handle(s, &q.req, q.at)
	}
}

// reply encodes v and queues it; replies are never dropped. It encodes
// straight into the outbox (whose buffer is reused from write to write),
// so an idle connection's pings make no garbage but the boxed reply.
func (s *Session) reply(v any) {
	s.queueReply(v, false)
}

// replyAuthOK queues auth_ok v and sets answered in the same step, before
// the outbox can be written: a frame the client sends once it reads
// auth_ok finds answered set, and whatever the loop answers from then on
// follows auth_ok.
func (s *Session) replyAuthOK(v any) {
	s.queueReply(v, true)
}

func (s *Session) queueReply(v any, answered bool) {
	if s.closed.Load() {
		return
	}
	s.omu.Lock()
	if len(s.out)+s.backlog > 2*s.g.cfg.MaxOutbound {
		s.omu.Unlock()
		s.g.metrics.drops.WithLabelValues("slow_device_closed").Inc()
		s.close()
		return
	}
	n := len(s.out)
	out, err := wire.AppendFrame(s.out, v)
	if err != nil {
		s.out = out[:n]
		s.omu.Unlock()
		s.g.log.Error("encoding reply", "err", err)
		return
	}
	s.out = out
	if answered {
		s.answered.Store(true)
	}
	s.flushLocked()
	s.omu.Unlock()
}

// push queues a frame that may be dropped for a slow device: conv and seq
// say what the device then has to sync. A frame without conv is never
// dropped. A coalesced push may wait push_coalesce for the gateway's
// coalescing flush (or go out earlier with any other frame).
func (s *Session) push(frame []byte, conv string, seq int64, coalesce bool, now time.Time) {
	var c *coalescer
	if coalesce && s.g.cfg.PushCoalesce > 0 {
		c = &s.g.coalesce
	}
	s.write(frame, conv, seq, c, now)
}

// relay queues a typing or receipt frame, which may wait relay_coalesce
// for the gateway's relay flush. It is dropped for a device whose backlog
// exceeds max_outbound (it is best effort; nothing is owed for it).
func (s *Session) relay(frame []byte) {
	if s.closed.Load() {
		return
	}
	var c *coalescer
	if s.g.cfg.RelayCoalesce > 0 {
		c = &s.g.relayCoalesce
	}
	s.omu.Lock()
	defer s.omu.Unlock()
	if len(s.out)+s.backlog > s.g.cfg.MaxOutbound || s.behind != nil {
		s.g.metrics.drops.WithLabelValues("slow_device_relay").Inc()
		return
	}
	s.queueLocked(frame, c)
}

// redeliver sends the hints the redelivery scan owes this device.
func (s *Session) redeliver(now time.Time) {
	if s.g.cfg.RedeliveryDelay <= 0 || !s.authed.Load() {
		return
	}
	s.omu.Lock()
	hints := s.redelivery.due(now, s.g.cfg.RedeliveryDelay)
	s.omu.Unlock()
	for _, h := range hints {
		s.reply(h)
		s.g.metrics.framesOut.WithLabelValues(wire.THint).Inc()
	}
}

// write appends frame to the outbox and schedules a flush on the loop
// (with a coalescer c: leaves that to c's flush). A
// push (conv != "") to a device whose backlog exceeds max_outbound is
// dropped and owed as a hint; a backlog of twice that (replies it does not
// read) closes the connection. now is when the push was handed over (for
// the redelivery scan).
func (s *Session) write(frame []byte, conv string, seq int64, c *coalescer, now time.Time) {
	if s.closed.Load() {
		return
	}
	limit := s.g.cfg.MaxOutbound
	s.omu.Lock()
	if conv != "" {
		s.knowLocked(conv, seq)
		if s.g.cfg.RedeliveryDelay > 0 {
			s.redelivery.pushed(conv, seq, now, s.g.cfg.RedeliveryDelay)
		}
	}
	pending := len(s.out) + s.backlog
	if conv != "" && (pending > limit || s.behind != nil) {
		if s.behind == nil {
			s.behind = map[string]int64{}
		}
		if seq > s.behind[conv] {
			s.behind[conv] = seq
		}
		s.omu.Unlock()
		s.g.metrics.drops.WithLabelValues("slow_device").Inc()
		return
	}
	if pending > 2*limit {
		s.omu.Unlock()
		s.g.metrics.drops.WithLabelValues("slow_device_closed").Inc()
		s.close()
		return
	}
	s.queueLocked(frame, c)
	s.omu.Unlock()
}

// queueLocked appends frame to the outbox and schedules a flush on the
// loop, or, with a coalescer c, leaves that to c's flush: the frame waits
// for it with whatever else this device is given until then (if a write
// is scheduled, the frame goes with it: see flushOnLoop). s.omu is held.
func (s *Session) queueLocked(frame []byte, c *coalescer) {
	s.out = append(s.out, frame...)
	if c != nil && !s.scheduled {
		c.add(s)
	} else {
		s.flushLocked()
	}
}

// know records that seq of conv is committed and visible to the user (it
// was pushed, confirmed or synced to this connection).
func (s *Session) know(conv string, seq int64) {
	s.omu.Lock()
	s.knowLocked(conv, seq)
	s.omu.Unlock()
}

// knowAll is know of each (conv, seq), under one lock.
func (s *Session) knowAll(ks []store.ConvSeq) {
	s.omu.Lock()
	for _, k := range ks {
		s.knowLocked(k.Conv, k.Seq)
	}
	s.omu.Unlock()
}

// acked tells the redelivery scan that conv is acked up to seq.
func (s *Session) acked(conv string, seq int64) {
	s.omu.Lock()
	s.redelivery.acked(conv, seq)
	s.omu.Unlock()
}

func (s *Session) knowLocked(conv string, seq int64) {
	if s.known == nil {
		s.known = map[string]int64{}
	}
	if k, ok := s.known[conv]; !ok || seq > k {
		s.known[conv] = seq
	}
}

// knows reports whether seq of conv is at most what the connection was
// given (know).
func (s *Session) knows(conv string, seq int64) bool {
	s.omu.Lock()
	k, ok := s.known[conv]
	s.omu.Unlock()
	return ok && seq <= k
}

// flushLocked schedules a write of the outbox on the event loop unless
// one is scheduled. The outbox is taken when the loop gets to it
// (flushOnLoop), not now: whatever this connection is given until then
// (the rest of a commit batch's replies and pushes, say) goes out in the
// same write, and a write costs about the same whatever its size.
func (s *Session) flushLocked() {
	if s.scheduled || (len(s.out) == 0 && !s.wsClosePending()) {
		return
	}
	s.schedule()
}

// schedule queues flushOnLoop on the event loop. An AsyncWritev of nothing
// makes no system call before its callback. s.omu is held.
func (s *Session) schedule() {
	s.scheduled = true
	if err := s.c.AsyncWritev(nil, s.flushFn); err != nil {
		s.scheduled = false
	}
}

// takeLocked hands over the outbox's bytes as they go on the wire (a
// WebSocket's as binary messages, then its close frame if one is due),
// swapping in the spare buffer so frames queued meanwhile do not touch
// them; nil if there is nothing to write. s.omu is held.
func (s *Session) takeLocked() []byte {
	if s.ws == nil {
		if len(s.out) == 0 {
			return nil
		}
		data := s.out
		s.out, s.spare = s.spare[:0], nil
		return data
	}
	if s.ws.closeSent {
		s.out = s.out[:0] // nothing follows the close frame
		return nil
	}
	if len(s.out) == 0 && !s.wsClosePending() {
		return nil
	}
	// In place when it can (as on TCP, one buffer is written while the
	// other fills), else into the spare buffer.
	data, inPlace := wsframe.MessagesInPlace(s.out)
	if inPlace {
		s.out, s.spare = s.spare[:0], nil
	} else {
		data = wsframe.AppendMessages(s.spare[:0], s.out)
		s.out, s.spare = s.out[:0], nil
	}
	if s.kick && s.ws.closeCode != 0 {
		data = wsframe.AppendClose(data, s.ws.closeCode)
		s.ws.closeSent = true
	}
	return data
}

// flushOnLoop is the scheduled write: it runs on the event loop, takes the
// outbox and writes it (what the socket does not take waits in gnet's
// outbound buffer), records the backlog, queues the hints owed once the
// device caught up, and schedules itself again if frames arrived during
// the write.
func (s *Session) flushOnLoop(c gnet.Conn, err error) error {
	s.omu.Lock()
	var data []byte
	if err == nil {
		data = s.takeLocked()
	}
	s.omu.Unlock()
	if len(data) > 0 {
		_, err = c.Write(data)
	}
	s.omu.Lock()
	defer s.omu.Unlock()
	s.scheduled = false
	if data != nil {
		s.spare = data[:0]
	}
	if err != nil {
		s.out = nil
		return nil
	}
	s.backlog = c.OutboundBuffered()
	if s.behind != nil && len(s.out)+s.backlog <= s.g.cfg.MaxOutbound/2 {
		for conv, head := range s.behind {
			if f, err := wire.AppendFrame(nil, wire.Hint{T: wire.THint, Conv: conv, Head: head}); err == nil {
				s.out = append(s.out, f...)
			}
		}
		s.behind = nil
	}
	if len(s.out) > 0 || s.wsClosePending() {
		s.schedule()
		if s.scheduled {
			return nil // the next write goes on from here
		}
	}
	if s.kick {
		_ = c.Close()
	}
	return nil
}

// probe asks the loop for the current backlog of a device that owes
// hints while nothing is being written (the tick calls it).
func (s *Session) probe() {
	s.omu.Lock()
	defer s.omu.Unlock()
	if s.behind == nil || s.scheduled {
		return
	}
	// A flush like any other: it records the backlog and queues the owed
	// hints once there is room, writing whatever frames wait in the
	// outbox (those a coalescer holds go out with them, a little early).
	s.schedule()
}

// kickOut sends {t:"kick", reason} and closes the connection after it.
func (s *Session) kickOut(reason string) {
	s.finalFrame(wire.Kick{T: wire.TKick, Reason: reason})
}

// fail sends an error and closes the connection after it.
func (s *Session) fail(rid string, e *wire.Error) {
	s.finalFrame(wire.ErrorReply(rid, e))
}

// finalFrame queues a last frame, stops taking requests, and closes the
// connection once the frame is written (or after 2 s if the peer does not
// read it).
func (s *Session) finalFrame(v any) {
	s.closing.Store(true)
	if !s.framing.Load() {
		// Still reading the PROXY header or the WebSocket handshake: the
		// peer does not speak frames yet.
		s.close()
		return
	}
	frame, _ := wire.AppendFrame(nil, v)
	s.omu.Lock()
	s.out = append(s.out, frame...)
	s.kick = true
	if s.ws != nil && s.ws.closeCode == 0 {
		s.ws.closeCode = wsCloseCode(v)
	}
	s.flushLocked()
	s.omu.Unlock()
	time.AfterFunc(2*time.Second, s.close)
}

// wsFail sends a WebSocket close frame with code (after whatever the
// outbox holds) and closes the connection.
func (s *Session) wsFail(code ws.StatusCode) {
	s.closing.Store(true)
	s.omu.Lock()
	if s.ws.closeCode == 0 {
		s.ws.closeCode = code
	}
	s.kick = true
	s.flushLocked() // now, or when the write in flight completes
	s.omu.Unlock()
	time.AfterFunc(2*time.Second, s.close)
}

// wsClosePending reports whether a WebSocket close frame is due and not
// sent yet. omu must be held.
func (s *Session) wsClosePending() bool {
	return s.ws != nil && s.kick && s.ws.closeCode != 0 && !s.ws.closeSent
}

func (s *Session) close() {
	_ = s.c.Close()
}

// allowSend takes one token of the device's send rate limit; otherwise it
// returns how long to wait.
func (s *Session) allowSend(now time.Time) (time.Duration, bool) {
	rate, burst := float64(s.g.cfg.SendRate), float64(s.g.cfg.SendBurst)
	if rate <= 0 {
		return 0, true
	}
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if s.sendLast.IsZero() {
		s.sendTokens = burst
	} else {
		s.sendTokens = min(burst, s.sendTokens+now.Sub(s.sendLast).Seconds()*rate)
	}
	s.sendLast = now
	if s.sendTokens >= 1 {
		s.sendTokens--
		return 0, true
	}
	return time.Duration((1 - s.sendTokens) / rate * float64(time.Second)), false
}
