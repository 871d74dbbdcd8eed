package loadtest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/wire"
)

// connectParallel is how many connections dial and authenticate at once.
const connectParallel = 32

// Conn is one device's connection as the load tool drives it.
type Conn struct {
	// Static after connect.
	r      *runner
	idx    int // shard of the histograms
	dev    Device
	c      *client.Conn
	routes map[string]convRef // conversations tracked for this device; set before dialing

	mu      sync.Mutex       // guards everything below
	out     []byte           // frames waiting for the writer
	spare   []byte           // the writer's previous buffer, for reuse
	body    []byte           // scratch body of BodySize bytes
	pending map[uint64]int64 // pipe mode: rid number → intended start (unix nanos)
	closing bool             // the runner closed this connection
	hints   map[string]int64 // conv → head of hints not synced yet
	queued  bool             // c is on r.syncQ

	ackArmed atomic.Bool // an ack flush is scheduled (armAck)

	// Scenario mixed.
	readWant map[string]int64   // conv → the seq its scheduled read will report (present while one is scheduled)
	reads    map[uint64]readReq // pipe mode: read rid number → the read awaiting its reply
	nextRead uint64

	wake chan struct{} // cap 1: the writer has work
}

// convRef is a device's place in a tracked conversation.
type convRef struct {
	track *convTrack
	i     int
}

// fdReserve is how many descriptors the tool keeps for itself beyond one
// per connection.
const fdReserve = 64

// checkFDs reads (and raises to the hard limit) the open-file limit.
func (r *runner) checkFDs() error {
	lim, err := openFileLimit()
	if err != nil {
		return fmt.Errorf("reading the open-file limit: %w", err)
	}
	r.fdLimit = lim
	return nil
}

// connectAll dials and authenticates one connection per device, at most
// connectParallel at a time, spreading them over the source addresses.
// tracks(i) names the conversations whose pushes device i is owed.
func (r *runner) connectAll(ctx context.Context, devs []Device, tracks func(i int) []*convTrack) ([]*Conn, error) {
	if err := r.checkConns(len(devs), len(devs)); err != nil {
		return nil, err
	}
	dialers := r.dialers()
	r.syncQ = make(chan *Conn, len(devs))
	conns := make([]*Conn, len(devs))
	sem := make(chan struct{}, connectParallel)
	var wg sync.WaitGroup
	var emu sync.Mutex
	var firstErr error
	for i, d := range devs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := r.dial(ctx, i, d, dialers[i%len(dialers)], tracks(i))
			if err != nil {
				emu.Lock()
				if firstErr == nil {
					firstErr = fmt.Errorf("connecting device %s: %w", d.ID, err)
				}
				emu.Unlock()
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	r.mu.Lock()
	for _, c := range conns {
		if c != nil {
			r.conns = append(r.conns, c)
		}
	}
	r.mu.Unlock()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	if firstErr != nil {
		return nil, firstErr
	}
	for _, c := range conns {
		if r.cfg.Client == ClientPipe {
			r.goroutine(c.writeLoop)
		}
	}
	return conns, nil
}

// checkConns refuses a run of conns connections (ports of them dialed
// in all, counting connections closed and dialed again) that the
// open-file limit or the ephemeral ports of the sources cannot hold.
func (r *runner) checkConns(conns, ports int) error {
	if need := int64(conns) + fdReserve; r.fdLimit > 0 && need > r.fdLimit {
		return fmt.Errorf("the open-file limit (%d) caps this run at about %d connections; it needs %d: lower the size or raise the limit (ulimit -n)",
			r.fdLimit, r.fdLimit-fdReserve, conns)
	}
	if r.fdLimit > 0 && int64(conns)+fdReserve > r.fdLimit*8/10 {
		r.note("%d connections use most of the open-file limit (%d)", conns, r.fdLimit)
	}
	if isLoopback(hostOf(r.cfg.Addr)) {
		if per, eph := (ports+r.cfg.Sources-1)/r.cfg.Sources, ephemeralPorts(); per > eph*9/10 {
			return fmt.Errorf("%d connections from %d source address(es) is %d per address, near the %d ephemeral ports: use -sources %d or more",
				ports, r.cfg.Sources, per, eph, (ports*10/9)/eph+1)
		}
	}
	return nil
}

// dialers returns one dialer per source address (127.0.0.1 … 127.0.0.N).
func (r *runner) dialers() []*net.Dialer {
	dialers := make([]*net.Dialer, r.cfg.Sources)
	for i := range dialers {
		// No TCP keep-alive (the protocol's pings find a dead peer): three
		// system calls fewer per connection, which a storm's 10,000
		// connections made at once on the tool's one core feel.
		dialers[i] = &net.Dialer{Timeout: 10 * time.Second, KeepAlive: -1}
		if r.cfg.Sources > 1 {
			dialers[i].LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(i+1))}
			dialers[i].Control = bindNoPort
		}
	}
	return dialers
}

// dialAddr is the address client.Dial takes: the gateway's host:port, or
// its WebSocket URL (-transport ws).
func (r *runner) dialAddr() string {
	if r.cfg.Transport == "ws" {
		return "ws://" + r.cfg.Addr + "/v1/ws"
	}
	return r.cfg.Addr
}

// dialStream opens a connection to the gateway (TCP, or WebSocket with
// -transport ws) that carries length-prefixed frames either way.
func (r *runner) dialStream(ctx context.Context, d *net.Dialer) (net.Conn, error) {
	if r.cfg.Transport == "ws" {
		return client.DialWebSocket(ctx, r.dialAddr(), d, nil)
	}
	return d.DialContext(ctx, "tcp", r.cfg.Addr)
}

func hostOf(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}

// maxAuthRetries bounds how often one device retries an auth refused
// with RATE_LIMITED.
const maxAuthRetries = 50

func (r *runner) dial(ctx context.Context, idx int, d Device, dialer *net.Dialer, tracks []*convTrack) (*Conn, error) {
	c := &Conn{r: r, idx: idx, dev: d, routes: map[string]convRef{}, pending: map[uint64]int64{},
		body: make([]byte, r.cfg.BodySize), wake: make(chan struct{}, 1)}
	for _, t := range tracks {
		c.routes[t.id] = convRef{track: t, i: t.member(d.ID)}
	}
	for i := 8; i < len(c.body); i++ {
		c.body[i] = 'x'
	}
	start := r.clk.now()
	var cc *client.Conn
	// RATE_LIMITED (the gateway's auth_rate): again after retry_after_ms,
	// as a client would.
	for attempt := 0; ; attempt++ {
		dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		var err error
		cc, err = client.Dial(dctx, r.dialAddr(), d.ID, d.Token, client.DialOptions{OnServerFrame: c.onFrame, Dialer: dialer})
		cancel()
		if wait, limited := retryAfter(err); limited && attempt < maxAuthRetries {
			r.connectLimited.Add(1)
			if !sleepCtx(ctx, wait) {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		break
	}
	r.connect.Record(idx, r.clk.now()-start)
	c.c = cc
	return c, nil
}

// send issues one send of the k-th scheduled message to conv, meant to
// start at intended (unix nanos). It never waits for the reply.
func (c *Conn) send(conv string, k, intended int64) {
	r := c.r
	if r.inflight.Load() >= r.cfg.MaxInflight {
		r.errs.Add("CLIENT_BACKLOG", 1)
		return
	}
	select {
	case <-c.c.Done():
		r.errs.Add("CONN_CLOSED", 1)
		return
	default:
	}
	r.sent.Add(1)
	r.inflight.Add(1)
	cmid := c.cmid(k)
	if r.cfg.Client == ClientDo {
		body := make([]byte, len(c.body))
		copy(body, c.body)
		binary.BigEndian.PutUint64(body, uint64(intended))
		r.goroutine(func() { c.doSend(conv, cmid, body, intended) })
		return
	}
	c.mu.Lock()
	binary.BigEndian.PutUint64(c.body, uint64(intended))
	rid := uint64(k)
	req := wire.Request{T: wire.TSend, Rid: ridString(rid), Conv: conv, Cmid: cmid, Body: c.body}
	var err error
	if c.out, err = wire.AppendFrame(c.out, &req); err == nil {
		c.pending[rid] = intended
	}
	c.mu.Unlock()
	if err != nil {
		r.inflight.Add(-1)
		r.errs.Add("ENCODE", 1)
		return
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// armAck schedules, if none is scheduled yet, an ack of every cursor of c
// that moved, AckDelay from now, as client.Client's AutoAck does: each
// device acks on its own clock, AckDelay after the first event it was not
// yet going to ack, so acks spread over time as pushes do (a shared
// ticker would make every device ack at the same instant).
func (c *Conn) armAck() {
	if c.r.acking.Load() && c.ackArmed.CompareAndSwap(false, true) {
		time.AfterFunc(c.r.cfg.AckDelay, c.flushAcks)
	}
}

// flushAcks acks each of c's cursors that moved since its last ack.
func (c *Conn) flushAcks() {
	c.ackArmed.Store(false)
	if !c.r.acking.Load() {
		return
	}
	for conv, ref := range c.routes {
		if ref.i < 0 {
			continue
		}
		if seq, ok := ref.track.ackable(ref.i); ok {
			c.ack(conv, seq)
		}
	}
}

// ack tells the server the device holds every event of conv up to seq,
// fire-and-forget (no rid: only an error comes back).
func (c *Conn) ack(conv string, seq int64) {
	c.r.acks.Add(1)
	c.fireAndForget(wire.Request{T: wire.TAck, Conv: conv, Seq: seq})
}

// ping writes a ping without rid (its pong is ignored), to keep the
// connection from the server's idle_timeout.
func (c *Conn) ping() {
	c.fireAndForget(wire.Request{T: wire.TPing})
}

// fireAndForget writes req (which has no rid) directly (ClientDo) or
// through the pipe writer.
func (c *Conn) fireAndForget(req wire.Request) {
	if c.r.cfg.Client == ClientDo {
		_ = c.c.Write(&req)
		return
	}
	c.mu.Lock()
	c.out, _ = wire.AppendFrame(c.out, &req)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// doSend is one send through client.Conn.Do.
func (c *Conn) doSend(conv, cmid string, body []byte, intended int64) {
	r := c.r
	m, err := c.c.Send(r.ctx, conv, cmid, body) // r.ctx ends when the runner closes
	defer r.inflight.Add(-1)                    // after the reply is recorded, as in onFrame
	if err != nil {
		r.errs.Add(errCode(err), 1)
		return
	}
	c.confirmed(m, intended)
}

// cmid names send k of c: "<device index>.<k>" in base 36, so any event
// tells which of the run's devices sent it.
func (c *Conn) cmid(k int64) string {
	var b [32]byte
	return string(strconv.AppendInt(append(strconv.AppendInt(b[:0], int64(c.idx), 36), '.'), k, 36))
}

// sentBy reports whether cmid names a send of c.
func (c *Conn) sentBy(cmid string) bool {
	i, _, ok := strings.Cut(cmid, ".")
	n, err := strconv.ParseInt(i, 36, 64)
	return ok && err == nil && int(n) == c.idx
}

// hinted records a hint (docs/protocol.md §5: "you are behind in conv, sync
// it") and queues c for a syncer, as a real client would sync.
func (c *Conn) hinted(conv string, head int64) {
	c.mu.Lock()
	if c.hints == nil {
		c.hints = map[string]int64{}
	}
	c.hints[conv] = max(c.hints[conv], head)
	queue := !c.queued
	c.queued = true
	c.mu.Unlock()
	if queue {
		c.r.syncQ <- c // never blocks: it holds every connection once
	}
}

// syncHinted syncs every hinted conversation of c from the device's
// cursor up to the hint's head, recording the msg events it reads.
func (c *Conn) syncHinted(ctx context.Context) {
	c.mu.Lock()
	hints := c.hints
	c.hints, c.queued = nil, false
	c.mu.Unlock()
	for conv, head := range hints {
		ref, ok := c.routes[conv]
		if !ok || ref.i < 0 {
			continue
		}
		after := ref.track.cursorOf(ref.i)
		failed := false
		for pages := 0; after < head && pages < 100; pages++ {
			m, err := c.c.Sync(ctx, conv, after, 1000)
			if err != nil {
				c.r.errs.Add("SYNC_"+errCode(err), 1)
				failed = true
				break
			}
			c.r.syncs.Add(1)
			c.recordSynced(ref, m.Events)
			if !m.More || m.Upto <= after {
				break
			}
			after = m.Upto
		}
		if !failed && after < head {
			// The page stopped below the hint's head at a seq still in
			// flight (a loaded server commits late): sync again shortly,
			// as a client does, until the run ends.
			c.r.goroutine(func() {
				select {
				case <-c.r.stop:
				case <-time.After(hintRetry):
					c.hinted(conv, head)
				}
			})
		}
	}
}

// recordSynced records the events of a sync page of the tracked
// conversation ref: messages as synced (a delivery unless pushed
// before), other events as held.
func (c *Conn) recordSynced(ref convRef, evs []wire.Event) {
	for _, ev := range evs {
		if ev.Kind == wire.KindMsg {
			c.r.tracker.Synced(ref.track, ref.i, ev.Seq, c.sentBy(ev.Cmid))
		} else {
			c.r.tracker.Held(ref.track, ref.i, ev.Seq)
		}
	}
	c.armAck()
}

// hintRetry is how long the tool waits before syncing a hinted
// conversation again when the sync stopped below the hint's head.
const hintRetry = 50 * time.Millisecond

// ridString formats a pipe-mode rid: "." + base 36. client.Conn's own rids
// are plain base 36, so the two never collide.
func ridString(k uint64) string {
	var b [16]byte
	return string(strconv.AppendUint(append(b[:0], '.'), k, 36))
}

func parseRid(s string) (uint64, bool) {
	if len(s) < 2 || s[0] != '.' {
		return 0, false
	}
	k, err := strconv.ParseUint(s[1:], 36, 64)
	return k, err == nil
}

// errCode names an error for the errors-by-code table.
func errCode(err error) string {
	switch {
	case errors.Is(err, client.ErrClosed):
		return "CONN_CLOSED"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "NO_REPLY"
	}
	if e, ok := wire.AsError(err); ok {
		return string(e.Code)
	}
	return "IO"
}

// writeLoop writes whatever frames are due, coalesced, until the
// connection or the run ends.
func (c *Conn) writeLoop() {
	for {
		select {
		case <-c.wake:
		case <-c.c.Done():
			return
		case <-c.r.stop:
			return
		}
		c.mu.Lock()
		buf := c.out
		c.out = c.spare[:0]
		c.spare = nil
		c.mu.Unlock()
		if len(buf) == 0 {
			continue
		}
		if err := c.c.WriteRaw(buf); err != nil {
			// The frames' pending entries stay: they count as CONN_CLOSED
			// at the end.
			_ = c.c.Close()
			return
		}
		c.mu.Lock()
		c.spare = buf[:0]
		c.mu.Unlock()
	}
}

// onFrame handles every frame that is not the reply to a Do call: pipe
// mode's send replies, pushes, hints, kicks. It runs on the connection's
// reader goroutine.
func (c *Conn) onFrame(m wire.Message) {
	r := c.r
	switch m.T {
	case wire.TReadOK:
		if r.mix != nil && isReadRid(m.Rid) {
			c.readReply(m)
		} else {
			r.badReplies.Add(1)
		}
	case wire.TSendOK, wire.TError:
		if r.mix != nil && isReadRid(m.Rid) {
			c.readReply(m)
			return
		}
		k, ok := parseRid(m.Rid)
		if !ok {
			if m.T == wire.TError {
				r.errs.Add(string(m.Code), 1) // an error without our rid
			} else {
				r.badReplies.Add(1)
			}
			return
		}
		c.mu.Lock()
		intended, ok := c.pending[k]
		delete(c.pending, k)
		c.mu.Unlock()
		if !ok {
			r.badReplies.Add(1)
			return
		}
		// inflight drops after the reply is counted and recorded: the
		// warm-up's drain waits for inflight 0 and then resets the
		// histograms, so a reply recorded after the drop could land in
		// the window while its count stayed in the warm-up.
		defer r.inflight.Add(-1)
		if m.T == wire.TError {
			r.errs.Add(string(m.Code), 1)
			return
		}
		c.confirmed(m, intended)
	case wire.TPush:
		if r.cfg.dropEvery > 0 && r.pushesSeen.Add(1)%r.cfg.dropEvery == 0 {
			return
		}
		ref, ok := c.routes[m.Conv]
		if m.Kind != wire.KindMsg {
			r.tracker.OtherEvent()
			if ok && ref.i >= 0 {
				r.tracker.Held(ref.track, ref.i, m.Seq)
				c.armAck()
			}
			return
		}
		if !ok || ref.i < 0 {
			r.tracker.Unexpected()
			return
		}
		c.armAck()
		if r.tracker.Pushed(ref.track, ref.i, m.Seq) && len(m.Body) >= 8 {
			now := r.clk.now()
			r.push.Record(c.idx, now-int64(binary.BigEndian.Uint64(m.Body)))
			storeMax(&r.lastPush, now)
			if r.mix != nil {
				c.pushed(m.Conv, m.Cmid, m.Seq, now)
			}
		}
	case wire.THint:
		r.hints.Add(1)
		c.hinted(m.Conv, m.Head)
	case wire.TReadChanged:
		if r.mix != nil {
			r.mix.changed.Add(1)
		}
	case wire.TTyping:
		if r.features != nil {
			r.features.relayed(c.idx, m.Conv, m.User, r.clk.now())
		}
	case wire.TReceipt:
		if r.features != nil {
			r.features.receiptsIn.Add(1)
		}
	case wire.TKick:
		r.kicks.Add(1)
	}
}

// confirmed records a send_ok.
func (c *Conn) confirmed(m wire.Message, intended int64) {
	r := c.r
	now := r.clk.now()
	r.sendOK.Record(c.idx, now-intended)
	storeMax(&r.lastOK, now)
	ref, ok := c.routes[m.Conv]
	if !ok || ref.i < 0 {
		r.badReplies.Add(1)
		return
	}
	r.tracker.Confirmed(ref.track, ref.i, m.Seq, m.Dup)
	c.armAck()
	if r.mix != nil && !m.Dup {
		// The sender's other devices are owed the push too.
		r.mix.siblingOwed.Add(int64(r.mix.devsOf[r.mix.userOf[c.idx]] - 1))
		c.afterSendOK(m.Conv, m.Seq)
	}
}

// storeMax raises a to v.
func storeMax(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// unanswered counts the pipe-mode sends still waiting for a reply.
func (c *Conn) unanswered() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int64(len(c.pending))
}

// dead reports whether the connection ended without the runner closing it.
func (c *Conn) dead() bool {
	c.mu.Lock()
	closing := c.closing
	c.mu.Unlock()
	select {
	case <-c.c.Done():
		return !closing
	default:
		return false
	}
}

func (c *Conn) close() {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	_ = c.c.Close()
}
