package client

// This file is the reference client: how an app should talk to Parley.
//
// # The model, in one page
//
// A conversation is a log of events numbered 1, 2, 3 … (docs/protocol.md §3).
// For every conversation it knows, the client keeps one number, the
// cursor: the highest seq such that every seq ≤ cursor has been processed
// (handed to OnEvent, or known to be invisible to this user). Everything
// else follows from keeping that number honest:
//
//   - push seq == cursor+1: deliver it, cursor = seq (a push carries the
//     whole event; no round trip needed).
//   - push seq <= cursor: a duplicate (the same event came by sync, or by a
//     push and then a sync). Drop it.
//   - push seq > cursor+1: something in between was missed (a push lost
//     with a connection, a slow device, our own send on another code
//     path). Keep the push in a small buffer and sync from the cursor.
//   - hint {conv, head} with head > cursor: sync.
//   - sync reply: deliver its events above the cursor in order, then set
//     cursor = upto (NOT the last event's seq: upto also covers invisible
//     seqs, and the server promises that a seq covered by upto never gains
//     an event later, so advancing only by upto never skips anything).
//     Loop while `more`.
//   - after every (re)connect: catch up on every known conversation,
//     because pushes sent while we were away are gone for good. One
//     snapshot request tells the heads of all of them; only those whose
//     head is above the cursor are synced.
//
// Because of the cursor, OnEvent sees every visible event of a
// conversation exactly once, in seq order, whichever path (push, local
// send, sync) brought it first.
//
// # Goroutines
//
// A Client runs:
//
//   - the supervisor (supervise): dials, authenticates, waits for the
//     connection to end, backs off, dials again;
//   - the event loop (loop): the only goroutine that touches conversation
//     state and the only one that calls OnEvent, OnReadChanged and OnState.
//     It never does network I/O, so a slow round trip never delays the
//     delivery of pushes of other conversations;
//   - sync workers (syncWorker), at most one per conversation at a time and
//     at most maxSyncs doing a request at once: they send sync requests and
//     hand every page to the loop;
//   - after each (re)connect, a snapshot worker (snapshotWorker) that
//     asks for the heads of every known conversation and hands the
//     replies to the loop;
//   - the acker (ackLoop), with Options.AutoAck;
//   - the reader goroutine of the current Conn.
//
// Close stops them all and waits for them.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/wire"
)

// Defaults of Options.
const (
	DefaultRequestTimeout = 10 * time.Second
	DefaultMinBackoff     = 200 * time.Millisecond
	DefaultMaxBackoff     = 10 * time.Second
	DefaultAckDelay       = 50 * time.Millisecond
)

// Tuning that an app has no reason to change.
const (
	// maxPending bounds the pushes buffered per conversation while a gap
	// is being repaired. A push that does not fit is dropped: the sync
	// that repairs the gap brings it anyway.
	maxPending = 1024
	// maxInbox bounds the frames waiting for the event loop (OnEvent is
	// slow). A push that does not fit is turned into a hint (the
	// conversation is synced instead).
	maxInbox = 8192
	// maxSyncs bounds the sync requests in flight at once (after a
	// reconnect every conversation wants one; the server queues at most
	// 256 requests per connection).
	maxSyncs = 8
	// maxSnapshot is the most conversations one snapshot request names
	// (the server's limit).
	maxSnapshot = 500
	// A sync page whose upto did not advance means a seq is allocated but
	// not committed yet on the server (a send in flight). Wait a little
	// and try again, a bounded number of times, then retry later.
	stallTries = 5
	stallMin   = 50 * time.Millisecond
	stallMax   = 200 * time.Millisecond
	stallRetry = time.Second
)

// Errors of Client.
var (
	// ErrClientClosed is returned by calls on (or waiting for) a closed Client.
	ErrClientClosed = errors.New("client: closed")
	// ErrReplaced: another connection of this device authenticated and the
	// server closed ours ({t:"kick", reason:"replaced"}). The client does
	// not reconnect: that would kick the other connection in turn, forever.
	ErrReplaced = errors.New("client: replaced by another connection of this device")
	// ErrServerShutdown: the server closed the connection because it is
	// shutting down ({t:"kick", reason:"shutdown"}). The client reconnects.
	ErrServerShutdown = errors.New("client: server shutting down")
	// ErrNotConnected: a sync was asked for while no connection is up.
	ErrNotConnected = errors.New("client: not connected")

	errStalled = errors.New("client: sync made no progress (a seq is still in flight on the server)")
)

// State is the connection state reported to Options.OnState.
type State int

// The states. A Client goes Connecting → Connected → Disconnected →
// Connecting … and ends in Closed (Close, kick "replaced", or a token the
// server rejects).
const (
	Connecting State = iota + 1
	Connected
	Disconnected
	Closed
)

func (s State) String() string {
	switch s {
	case Connecting:
		return "connecting"
	case Connected:
		return "connected"
	case Disconnected:
		return "disconnected"
	case Closed:
		return "closed"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Options configure a Client. Addr, Device and Token are required.
//
// The callbacks (OnEvent, OnReadChanged, OnState) are all called from one
// goroutine, one at a time, so they need no locking among themselves. They
// should return quickly (store the event, post to the UI thread): while one
// runs, nothing else is delivered. They may call Send, Cursor, Watch and
// the request wrappers, but not Sync or Close (both wait for that
// goroutine, so they would deadlock).
type Options struct {
	Addr   string // host:port of a Parley gateway
	Device string // device id
	Token  string // the device's token

	// RequestTimeout bounds each request attempt (and dial + auth).
	// Default 10 s.
	RequestTimeout time.Duration
	// MinBackoff and MaxBackoff bound the reconnect delay: attempt n waits
	// a uniformly random time in [0, min(MaxBackoff, MinBackoff·2ⁿ))
	// ("full jitter", so a server restart is not followed by every client
	// reconnecting at the same instant). Defaults 200 ms and 10 s. An auth
	// answered RATE_LIMITED (the gateway is over its auth rate) waits the
	// retry_after_ms the server gives instead, plus up to MinBackoff.
	MinBackoff, MaxBackoff time.Duration
	// SyncLimit is the page size of sync requests (0: the server's
	// default, 100; the server caps it at 1000).
	SyncLimit int

	// OnEvent receives every visible event of every known conversation
	// exactly once per conversation, in seq order per conversation:
	// messages, joins, leaves and recalls (a recall's Target is the seq of
	// the message to blank; the message itself, if synced later, comes
	// with Recalled set and an empty body). The client's own sends are
	// delivered too.
	//
	// Exactly once holds within an epoch: if the server reports a new
	// epoch for a conversation (it could no longer guarantee seq
	// continuity, docs/protocol.md §4), the client drops its cursor and
	// delivers the conversation again from min_seq; the app should then
	// drop what it stored for that conversation. The same happens if the
	// cursor given to Watch is beyond the conversation's head
	// (CURSOR_AHEAD): the cursor is reset to 0.
	OnEvent func(conv string, ev wire.Event)
	// OnReadChanged receives read_changed pushes: the user's read position
	// advanced on another of their devices.
	OnReadChanged func(conv string, read, unread int64)
	// OnState receives every state change. err says why for Disconnected
	// (the connection's error, or ErrServerShutdown) and for Closed
	// (ErrReplaced, the AUTH_FAILED *wire.Error, or nil after Close).
	OnState func(st State, err error)

	// AutoAck acks each conversation's cursor after OnEvent has returned
	// for the events up to it, batched: at most one ack per conversation
	// every AckDelay. Use it when OnEvent stores events durably before
	// returning; otherwise call Ack yourself once they are stored.
	AutoAck bool
	// AckDelay is the AutoAck batching window (default 50 ms). AutoAck's
	// acks carry no rid (one write per window for every conversation that
	// moved; errors are logged): the server holds them and commits the
	// newest per conversation every ack_coalesce (docs/consistency.md,
	// "Acks"). A longer window (250 ms to 1 s) costs the device fewer
	// radio wake-ups; the server needs acks only for its redelivery scan.
	AckDelay time.Duration

	// Dialer, if set, dials the TCP connections.
	Dialer *net.Dialer
	// Logger receives the client's diagnostics (default: discarded).
	Logger *slog.Logger
}

// Client is a long-lived, self-healing session with Parley: it keeps one
// authenticated connection up (reconnecting with backoff), tracks the
// conversations it knows, and delivers their events to Options.OnEvent
// exactly once and in order. All methods are safe for concurrent use.
type Client struct {
	opt Options
	log *slog.Logger

	ctx     context.Context // cancelled by Close; bounds the client's own requests
	cancel  context.CancelFunc
	closing chan struct{} // closed by Close
	stopped chan struct{} // closed when the supervisor ends (Close, replaced, AUTH_FAILED)
	firstUp chan struct{} // closed at the first successful auth
	ackWake chan struct{} // wakes the acker (capacity 1)
	ackedOn *Conn         // the connection the acker last wrote to (acker only)
	syncSem chan struct{} // bounds sync requests in flight
	wg      sync.WaitGroup
	in      inbox

	firstUpOnce sync.Once
	closeOnce   sync.Once

	mu      sync.Mutex
	started bool
	closed  bool
	conn    *Conn
	connCh  chan struct{} // closed (and replaced) whenever conn changes
	state   State
	err     error                 // why the client stopped for good
	convs   map[string]*convState // every known conversation
	final   bool                  // OnState(Closed) was delivered

	// Owned by the event loop.
	retries map[string]time.Time // conversations to sync again at a time
}

// convState is one known conversation. cursor is written by the event loop
// only and read by anyone; acked belongs to the acker; everything else
// belongs to the event loop.
type convState struct {
	id     string
	cursor atomic.Int64
	acked  int64

	epoch   int64                // from sync replies; 0 until the first
	head    int64                // highest head or seq heard of
	pending map[int64]wire.Event // pushes above cursor+1, waiting for the gap to be filled
	gen     int                  // bumped when the cursor is reset: pages of older syncs are stale
	syncing bool                 // a sync worker runs
	again   bool                 // sync again when it ends (something new arrived meanwhile)
	fails   int                  // consecutive failed syncs (for the retry backoff)
	dead    error                // NOT_MEMBER: never a member; not synced automatically
	next    []chan error         // Sync calls waiting for the next round
	round   []chan error         // Sync calls waiting for the current round
}

// New returns a Client; Start connects it.
func New(opt Options) *Client {
	if opt.RequestTimeout <= 0 {
		opt.RequestTimeout = DefaultRequestTimeout
	}
	if opt.MinBackoff <= 0 {
		opt.MinBackoff = DefaultMinBackoff
	}
	if opt.MaxBackoff <= 0 {
		opt.MaxBackoff = DefaultMaxBackoff
	}
	if opt.MaxBackoff < opt.MinBackoff {
		opt.MaxBackoff = opt.MinBackoff
	}
	if opt.AckDelay <= 0 {
		opt.AckDelay = DefaultAckDelay
	}
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Client{
		opt:     opt,
		log:     log.With("device", opt.Device),
		closing: make(chan struct{}),
		stopped: make(chan struct{}),
		firstUp: make(chan struct{}),
		ackWake: make(chan struct{}, 1),
		syncSem: make(chan struct{}, maxSyncs),
		connCh:  make(chan struct{}),
		convs:   map[string]*convState{},
		retries: map[string]time.Time{},
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.in.wake = make(chan struct{}, 1)
	return c
}

// Start starts the client in the background and waits until it is first
// connected (nil), it stopped for good (ErrReplaced, an AUTH_FAILED
// *wire.Error), or ctx is done (ctx.Err(); the client keeps trying in the
// background until Close). Call Watch before Start for the conversations
// the app has stored cursors for.
func (c *Client) Start(ctx context.Context) error {
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return ErrClientClosed
	case c.started:
		c.mu.Unlock()
		return errors.New("client: already started")
	}
	c.started = true
	n := 2
	if c.opt.AutoAck {
		n++
	}
	c.wg.Add(n)
	c.mu.Unlock()
	go c.loop()
	go c.supervise()
	if c.opt.AutoAck {
		go c.ackLoop()
	}
	select {
	case <-c.firstUp:
		return nil
	case <-c.stopped:
		return c.stopErr()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close closes the connection, stops every goroutine of the client and
// waits for them. OnState(Closed, nil) is its last callback (unless the
// client had already stopped). Calls waiting on the client return
// ErrClientClosed. Safe to call more than once.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		conn := c.conn
		c.mu.Unlock()
		close(c.closing)
		c.cancel()
		if conn != nil {
			conn.Close()
		}
		c.wg.Wait()
		c.mu.Lock()
		report := !c.final && c.started
		c.final, c.state = true, Closed
		why := c.err // set if the client had stopped but the loop had not reported it yet
		c.mu.Unlock()
		// Every other goroutine has ended: calling OnState here keeps the
		// callbacks serialized.
		if report && c.opt.OnState != nil {
			c.opt.OnState(Closed, why)
		}
	})
	return nil
}

// Err returns why the client stopped for good (ErrReplaced, an
// AUTH_FAILED *wire.Error), ErrClientClosed after Close, or nil while it
// runs.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	if c.closed {
		return ErrClientClosed
	}
	return nil
}

// State returns the current connection state (0 before Start).
func (c *Client) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// Conn returns the current connection, or nil while disconnected. Tests
// close it to simulate a network failure; apps should use the Client's
// methods instead.
func (c *Client) Conn() *Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn
}

// Watch starts tracking conv from a local cursor: the app's stored cursor
// (every event up to after is already stored), or 0 for the whole history.
// A conversation already known is left as it is. Conversations also become
// known without Watch: a push or hint of an unknown conversation makes the
// client watch it from cursor 0 and sync it, so the app gets its history
// (the push alone would only give the newest event); and so do
// conversations created, joined or left through this client.
func (c *Client) Watch(conv string, after int64) {
	if _, isNew := c.lookup(conv, after); isNew {
		c.in.put(triggerItem{conv: conv})
	}
}

// Cursor returns conv's cursor: the highest seq such that every event up
// to it has been delivered to OnEvent (or is invisible to this user). 0 for
// an unknown conversation. This is what the app stores, and what it gives
// to Watch at the next start.
func (c *Client) Cursor(conv string) int64 {
	c.mu.Lock()
	cs := c.convs[conv]
	c.mu.Unlock()
	if cs == nil {
		return 0
	}
	return cs.cursor.Load()
}

// Watched returns every known conversation with its cursor.
func (c *Client) Watched() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.convs))
	for id, cs := range c.convs {
		out[id] = cs.cursor.Load()
	}
	return out
}

// Sync pulls conv until upto == head, feeding OnEvent, and returns when
// done. It waits for a connection first (bounded by ctx). An unknown conv
// is watched from 0. Syncing is automatic (gaps, hints, reconnects); call
// Sync when the app needs to know a conversation is up to date, e.g. when
// the user opens it. Do not call it from a callback.
func (c *Client) Sync(ctx context.Context, conv string) error {
	if _, err := c.waitConn(ctx); err != nil {
		return err
	}
	done := make(chan error, 1)
	c.in.put(syncReq{conv: conv, done: done})
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-c.closing:
		return ErrClientClosed
	}
}

// Send sends a message and returns its send_ok (Seq, Ts, Dup).
//
// cmid is the app's id for this message: generate it once, store it with
// the outgoing message, and reuse it for every retry. The server stores a
// (sender, cmid) once and answers a repeat with the original seq and
// Dup:true, so Send retries freely: when the connection drops before the
// reply (was it committed? we cannot know), it sends again with the same
// cmid on the next connection; likewise after a per-attempt timeout,
// after UNAVAILABLE (with backoff) and after RATE_LIMITED (after
// retry_after_ms). A send is thus never duplicated, and never lost
// silently:
//
//   - nil error: the message is committed at Seq (once).
//   - a *wire.Error (NOT_MEMBER, TOO_LARGE, BAD_REQUEST …): rejected,
//     nothing was stored.
//   - ctx's error, ErrClientClosed, ErrReplaced: the outcome is unknown.
//     Keep the message in the outbox and call Send again later with the
//     same cmid.
//
// The message is delivered to OnEvent like any other event (the server
// does not push it to the sending device; the client uses the reply).
func (c *Client) Send(ctx context.Context, conv, cmid string, body []byte) (wire.Message, error) {
	for attempt := 0; ; attempt++ {
		conn, err := c.waitConn(ctx)
		if err != nil {
			return wire.Message{}, err
		}
		rctx, cancel := context.WithTimeout(ctx, c.opt.RequestTimeout)
		r, err := conn.Send(rctx, conv, cmid, body)
		cancel()
		if err == nil {
			c.sent(conn, conv, cmid, body, r)
			return r, nil
		}
		if ctx.Err() != nil {
			return wire.Message{}, ctx.Err()
		}
		delay := c.backoff(attempt)
		if we, ok := wire.AsError(err); ok {
			switch we.Code {
			case wire.RateLimited:
				delay = max(delay, time.Duration(we.RetryAfterMs)*time.Millisecond)
			case wire.Unavailable: // nothing was committed; retry later
			default:
				return r, err
			}
		}
		// Otherwise the connection dropped or the attempt timed out: the
		// send may or may not be committed. Same cmid again.
		c.log.Debug("send: retrying", "conv", conv, "cmid", cmid, "err", err, "delay", delay)
		if err := c.sleepCtx(ctx, delay); err != nil {
			return wire.Message{}, err
		}
	}
}

// sent feeds the event a send_ok describes to the event loop, as if it had
// been pushed: the server does not push it to the sending device.
func (c *Client) sent(conn *Conn, conv, cmid string, body []byte, r wire.Message) {
	if r.Dup {
		// Committed earlier, maybe with another body (a cmid reused by
		// mistake): let a sync fetch the stored event if we lack it.
		c.in.put(hintItem{conv: conv, head: r.Seq})
		return
	}
	c.in.put(localEvent{conv: conv, ev: wire.Event{Seq: r.Seq, Kind: wire.KindMsg, Sender: conn.Auth.User,
		Body: slices.Clone(body), Ts: r.Ts, Cmid: cmid}})
}

// ---- thin request wrappers ----
//
// They wait for a connection (bounded by ctx), send one request on it with
// the per-request timeout, and do not retry (members_add, for one, is not
// idempotent: a retry would append a second join event). Replies that
// announce new events the server does not push to this device (creations,
// membership changes, recalls made here) make the client sync the
// conversation, so they reach OnEvent like everything else.

func (c *Client) do(ctx context.Context, f func(context.Context, *Conn) (wire.Message, error)) (wire.Message, error) {
	conn, err := c.waitConn(ctx)
	if err != nil {
		return wire.Message{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, c.opt.RequestTimeout)
	defer cancel()
	return f(rctx, conn)
}

// Read sets the user's read position in conv (max-merged by the server);
// the reply carries the merged position and the unread count. The user's
// other devices get read_changed; this one does not (OnReadChanged is not
// called for it).
func (c *Client) Read(ctx context.Context, conv string, seq int64) (wire.Message, error) {
	return c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.Read(ctx, conv, seq) })
}

// Ack tells the server this device holds every event of conv up to seq
// (with AutoAck the client does it by itself).
func (c *Client) Ack(ctx context.Context, conv string, seq int64) (wire.Message, error) {
	return c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.Ack(ctx, conv, seq) })
}

// CreateGroup creates a group with the caller and members (id "" lets the
// server choose) and watches it.
func (c *Client) CreateGroup(ctx context.Context, id, title string, members ...string) (wire.Message, error) {
	r, err := c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) {
		return conn.CreateGroup(ctx, id, title, members...)
	})
	if err == nil {
		c.follow(r.Conv, r.Head)
	}
	return r, err
}

// CreateDirect opens (or returns) the direct conversation with other and
// watches it.
func (c *Client) CreateDirect(ctx context.Context, other string) (wire.Message, error) {
	r, err := c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.CreateDirect(ctx, other) })
	if err == nil {
		c.follow(r.Conv, r.Head)
	}
	return r, err
}

// AddMembers adds users to conv (one join event).
func (c *Client) AddMembers(ctx context.Context, conv string, users ...string) (wire.Message, error) {
	r, err := c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) {
		return conn.AddMembers(ctx, conv, users...)
	})
	if err == nil {
		c.follow(conv, r.Head)
	}
	return r, err
}

// Leave leaves conv. The conversation stays known: its leave event is
// still delivered, and a former member may still sync its history.
func (c *Client) Leave(ctx context.Context, conv string) (wire.Message, error) {
	r, err := c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.Leave(ctx, conv) })
	if err == nil {
		c.follow(conv, r.Head)
	}
	return r, err
}

// Recall recalls this user's message at seq. The recall event (reply's
// Seq) reaches OnEvent; its Target is seq.
func (c *Client) Recall(ctx context.Context, conv string, seq int64) (wire.Message, error) {
	r, err := c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.Recall(ctx, conv, seq) })
	if err == nil {
		c.follow(conv, r.Seq)
	}
	return r, err
}

// Convs lists a page of the user's conversations (limit 0: server default;
// pass the previous reply's Cursor for the next page).
func (c *Client) Convs(ctx context.Context, limit int, cursor string) (wire.Message, error) {
	return c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.Convs(ctx, limit, cursor) })
}

// Snapshot sends a snapshot request as is. Its events are not fed to
// OnEvent (a snapshot may skip events; the cursor could not honestly
// advance past them).
func (c *Client) Snapshot(ctx context.Context, convs []wire.ConvAfter) (wire.Message, error) {
	return c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.Snapshot(ctx, convs) })
}

// follow watches conv (from 0 if unknown) and makes sure events up to head
// are fetched.
func (c *Client) follow(conv string, head int64) {
	if conv == "" {
		return
	}
	c.lookup(conv, 0)
	c.in.put(hintItem{conv: conv, head: head})
}

// ---- connection supervisor ----

// supervise keeps a connection up until Close, or until the server tells
// us not to come back (kick "replaced", AUTH_FAILED).
func (c *Client) supervise() {
	defer c.wg.Done()
	defer close(c.stopped)
	attempt := 0
	for {
		c.setState(Connecting, nil)
		conn, sess, err := c.dial()
		if err != nil {
			if c.isClosing() {
				return
			}
			delay := c.backoff(attempt)
			switch we, _ := wire.AsError(err); {
			case we != nil && we.Code == wire.AuthFailed:
				// Retrying a bad token cannot help; the app must
				// re-provision the device.
				c.stop(err)
				return
			case we != nil && we.Code == wire.RateLimited:
				// The gateway is busy (a reconnect storm) and says when to
				// come back: wait that long instead of our own backoff,
				// plus a little jitter of our own so the refused clients do
				// not come back together. Not a failure: the backoff does
				// not grow, and the client never gives up over it.
				delay = time.Duration(we.RetryAfterMs)*time.Millisecond + c.jitter(c.opt.MinBackoff)
			default:
				attempt++
			}
			c.log.Info("connect failed", "err", err, "retry_in", delay)
			c.setState(Disconnected, err)
			if !c.sleep(delay) {
				return
			}
			continue
		}
		attempt = 0
		c.setConn(conn)
		c.setState(Connected, nil)
		// Pushes sent while we were away are lost: catch up on every known
		// conversation. (Queued before Start returns, so that the resync
		// covers exactly the conversations known before the connection.)
		c.in.put(resyncItem{})
		c.firstUpOnce.Do(func() { close(c.firstUp) })
		c.wakeAcker()

		select {
		case <-conn.Done():
		case <-c.closing:
		}
		c.setConn(nil)
		conn.Close()
		if c.isClosing() {
			return
		}
		why := conn.Err()
		switch sess.kicked() {
		case wire.KickReplaced:
			c.log.Info("replaced by another connection of this device; not reconnecting")
			c.stop(ErrReplaced)
			return
		case wire.KickShutdown:
			why = ErrServerShutdown
		case "":
		default:
			why = fmt.Errorf("client: kicked by the server: %s", sess.kicked())
		}
		if why == nil {
			why = ErrClosed
		}
		delay := c.backoff(attempt)
		attempt++
		c.log.Info("disconnected", "err", why, "retry_in", delay)
		c.setState(Disconnected, why)
		if !c.sleep(delay) {
			return
		}
	}
}

// session is what the supervisor needs to know about one connection.
type session struct {
	c    *Client
	kick atomic.Pointer[string]
}

func (s *session) kicked() string {
	if p := s.kick.Load(); p != nil {
		return *p
	}
	return ""
}

// onFrame runs on the connection's reader goroutine: it must not block, so
// it only queues frames for the event loop.
func (s *session) onFrame(m wire.Message) {
	switch m.T {
	case wire.TPush:
		s.c.in.putPush(m)
	case wire.THint, wire.TReadChanged:
		s.c.in.put(m)
	case wire.TKick:
		// Recorded before the reader sees the server close the
		// connection, so the supervisor knows why it ended.
		s.kick.Store(&m.Reason)
	case wire.TError:
		// An error for a request without rid, or for one we stopped
		// waiting for.
		s.c.log.Warn("server error", "code", m.Code, "msg", m.Msg, "rid", m.Rid)
	default:
		// A reply that came after its request timed out.
		s.c.log.Debug("unexpected frame", "frame", m.String())
	}
}

func (c *Client) dial() (*Conn, *session, error) {
	s := &session{c: c}
	ctx, cancel := context.WithTimeout(c.ctx, c.opt.RequestTimeout)
	defer cancel()
	conn, err := Dial(ctx, c.opt.Addr, c.opt.Device, c.opt.Token, DialOptions{OnServerFrame: s.onFrame, Dialer: c.opt.Dialer})
	return conn, s, err
}

// backoff returns the delay before retry number attempt (from 0): full
// jitter over an exponential bound capped at MaxBackoff.
func (c *Client) backoff(attempt int) time.Duration {
	bound := c.opt.MaxBackoff
	if attempt < 30 {
		bound = min(bound, c.opt.MinBackoff<<attempt)
	}
	return c.jitter(bound)
}

// jitter returns a uniformly random duration in [0, d).
func (c *Client) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d)
}

func (c *Client) setConn(conn *Conn) {
	c.mu.Lock()
	c.conn = conn
	close(c.connCh)
	c.connCh = make(chan struct{})
	c.mu.Unlock()
}

// setState records st and queues OnState(st, err).
func (c *Client) setState(st State, err error) {
	c.mu.Lock()
	c.state = st
	c.mu.Unlock()
	c.in.put(stateItem{st: st, err: err})
}

// stop records why the client stopped for good and reports Closed.
func (c *Client) stop(err error) {
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
	c.setState(Closed, err)
}

func (c *Client) stopErr() error {
	if err := c.Err(); err != nil {
		return err
	}
	return ErrClientClosed
}

// waitConn returns the current connection, waiting for one if needed.
func (c *Client) waitConn(ctx context.Context) (*Conn, error) {
	for {
		c.mu.Lock()
		conn, changed := c.conn, c.connCh
		c.mu.Unlock()
		if conn != nil {
			select {
			case <-conn.Done(): // ending: the supervisor will replace it
			default:
				return conn, nil
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.stopped:
			return nil, c.stopErr()
		case <-c.closing:
			return nil, ErrClientClosed
		}
	}
}

func (c *Client) isClosing() bool {
	select {
	case <-c.closing:
		return true
	default:
		return false
	}
}

// sleep waits d; false if the client closed meanwhile.
func (c *Client) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.closing:
		return false
	}
}

func (c *Client) sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.stopped:
		return c.stopErr()
	case <-c.closing:
		return ErrClientClosed
	}
}

// ---- the event loop ----

// Items of the event loop's inbox (besides push, hint and read_changed
// frames, queued as wire.Message).
type (
	localEvent struct { // our own send, from its send_ok
		conv string
		ev   wire.Event
	}
	hintItem struct { // "events up to head exist": sync if behind
		conv string
		head int64
	}
	triggerItem struct{ conv string } // sync conv (Watch)
	syncReq     struct {              // Client.Sync
		conv string
		done chan error
	}
	syncPage struct { // a sync_ok, from a worker
		conv  string
		gen   int
		reply wire.Message
		next  chan int64 // the cursor after applying it; -1: stop
	}
	syncDone struct { // a worker ended
		conv string
		gen  int
		err  error
	}
	resyncItem    struct{} // after a (re)connect
	snapshotReply struct { // one snapshot chunk of a resync, from snapshotWorker
		conn  *Conn
		asked []wire.ConvAfter
		reply wire.Message
		err   error
	}
	stateItem struct {
		st  State
		err error
	}
)

// inbox queues items for the event loop without ever blocking the sender
// (the connection's reader must keep reading, or replies would stall).
type inbox struct {
	mu     sync.Mutex
	items  []any
	behind map[string]int64 // pushes that did not fit: conv → highest seq
	wake   chan struct{}
}

func (q *inbox) put(it any) {
	q.mu.Lock()
	q.items = append(q.items, it)
	q.mu.Unlock()
	q.signal()
}

// putPush queues a push, or if the loop is far behind, remembers only that
// the conversation must be synced.
func (q *inbox) putPush(m wire.Message) {
	q.mu.Lock()
	if len(q.items) < maxInbox {
		q.items = append(q.items, m)
	} else {
		if q.behind == nil {
			q.behind = map[string]int64{}
		}
		q.behind[m.Conv] = max(q.behind[m.Conv], m.Seq)
	}
	q.mu.Unlock()
	q.signal()
}

func (q *inbox) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *inbox) take() []any {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	for conv, head := range q.behind {
		items = append(items, hintItem{conv: conv, head: head})
	}
	q.behind = nil
	return items
}

func (c *Client) loop() {
	defer c.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		c.armRetries(timer)
		select {
		case <-c.closing:
			return
		case <-c.in.wake:
		case <-timer.C:
			c.fireRetries()
		}
		for _, it := range c.in.take() {
			if c.isClosing() {
				return
			}
			c.handle(it)
		}
	}
}

func (c *Client) handle(it any) {
	switch it := it.(type) {
	case wire.Message:
		switch it.T {
		case wire.TPush:
			c.onEvent(it.Conv, it.Event())
		case wire.THint:
			c.onHint(it.Conv, it.Head)
		case wire.TReadChanged:
			if c.opt.OnReadChanged != nil {
				c.opt.OnReadChanged(it.Conv, it.Read, it.Unread)
			}
		}
	case localEvent:
		c.onEvent(it.conv, it.ev)
	case hintItem:
		c.onHint(it.conv, it.head)
	case triggerItem:
		if cs := c.known(it.conv); cs != nil {
			c.trigger(cs)
		}
	case syncReq:
		cs, _ := c.lookup(it.conv, 0)
		cs.dead = nil // asked for explicitly: try again
		cs.next = append(cs.next, it.done)
		c.trigger(cs)
	case syncPage:
		c.onPage(it)
	case syncDone:
		c.onSyncDone(it)
	case resyncItem:
		c.resyncAll()
	case snapshotReply:
		c.onSnapshot(it)
	case stateItem:
		if it.st == Closed {
			c.mu.Lock()
			c.final = true
			c.mu.Unlock()
		}
		if c.opt.OnState != nil {
			c.opt.OnState(it.st, it.err)
		}
	}
}

// lookup returns conv's state, creating it with cursor after if unknown.
func (c *Client) lookup(conv string, after int64) (cs *convState, isNew bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cs = c.convs[conv]; cs != nil {
		return cs, false
	}
	cs = &convState{id: conv, head: after}
	cs.cursor.Store(after)
	c.convs[conv] = cs
	return cs, true
}

func (c *Client) known(conv string) *convState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.convs[conv]
}

// onEvent handles one event that came without a sync: a push, or our own
// send.
func (c *Client) onEvent(conv string, ev wire.Event) {
	cs, _ := c.lookup(conv, 0)
	cs.dead = nil // the server says we are a member
	cs.head = max(cs.head, ev.Seq)
	cur := cs.cursor.Load()
	switch {
	case ev.Seq <= cur:
		return // duplicate
	case ev.Seq == cur+1:
		c.deliver(cs, ev)
		c.drainPending(cs)
	default:
		// A gap: keep the event and fetch what is missing.
		if cs.pending == nil {
			cs.pending = map[int64]wire.Event{}
		}
		if len(cs.pending) < maxPending {
			cs.pending[ev.Seq] = ev
		}
		c.trigger(cs)
	}
}

func (c *Client) onHint(conv string, head int64) {
	cs, _ := c.lookup(conv, 0)
	cs.dead = nil
	cs.head = max(cs.head, head)
	if head > cs.cursor.Load() {
		c.trigger(cs)
	}
}

// deliver hands ev to the app and advances the cursor past it.
func (c *Client) deliver(cs *convState, ev wire.Event) {
	if c.opt.OnEvent != nil {
		c.opt.OnEvent(cs.id, ev)
	}
	cs.cursor.Store(ev.Seq)
	c.wakeAcker()
}

// drainPending drops buffered pushes the cursor has passed and delivers
// those that are now next in line.
func (c *Client) drainPending(cs *convState) {
	if len(cs.pending) == 0 {
		return
	}
	cur := cs.cursor.Load()
	for seq := range cs.pending {
		if seq <= cur {
			delete(cs.pending, seq)
		}
	}
	for {
		ev, ok := cs.pending[cs.cursor.Load()+1]
		if !ok {
			break
		}
		delete(cs.pending, ev.Seq)
		c.deliver(cs, ev)
	}
	if len(cs.pending) == 0 {
		cs.pending = nil
	}
}

// trigger makes sure cs gets synced: now, or right after the running sync
// (which may have read the head before the news that triggered this).
func (c *Client) trigger(cs *convState) {
	if cs.dead != nil {
		for _, w := range cs.next {
			w <- cs.dead
		}
		cs.next = nil
		return
	}
	if cs.syncing {
		cs.again = true
		return
	}
	delete(c.retries, cs.id)
	cs.syncing, cs.again = true, false
	cs.round, cs.next = cs.next, nil
	c.wg.Add(1)
	go c.syncWorker(cs.id, cs.gen, cs.cursor.Load())
}

// resyncAll catches up on every known conversation after each
// (re)connect: pushes sent while we were away are gone for good.
//
// It asks for the heads first, with one snapshot request for all of them
// (chunks of maxSnapshot, sent by snapshotWorker; the event loop does no
// I/O), and then syncs only the conversations whose head is above the
// cursor (onSnapshot). Most conversations have not moved while a device
// was away, so a reconnect costs one round trip instead of one sync per
// conversation.
//
// The snapshot's events are deliberately NOT delivered. The cursor rule
// is "every seq <= cursor has been processed", and a snapshot cannot prove
// it: its events are the visible events only, with no upto, so a seq
// missing between two of them may be invisible to this user (outside a
// membership period, a hole) or simply not committed yet; and a large gap
// comes back as a tail with `skipped` events left out. Only a sync page
// (whose upto covers the invisible seqs, and never gains an event later)
// may move the cursor. Delivering the snapshot events would save one
// round trip per changed conversation at the price of a second, subtler
// cursor rule; the existing sync path is already correct, so it does the
// work.
//
// Dead conversations (NOT_MEMBER) are left out, as before: a push, hint
// or explicit Sync revives them. A snapshot carries no epoch, so a new
// epoch of a conversation whose head happens to equal our cursor is only
// noticed by its next sync (the next event triggers one). Conversations
// the user was added to while offline are not discovered here (only by
// their next push or hint); the app can list them with Convs.
func (c *Client) resyncAll() {
	c.wakeAcker() // a new connection: ack everything again (flushAcks)
	c.mu.Lock()
	all := make([]wire.ConvAfter, 0, len(c.convs))
	for _, cs := range c.convs {
		if cs.dead == nil {
			all = append(all, wire.ConvAfter{Conv: cs.id, After: cs.cursor.Load()})
		}
	}
	c.mu.Unlock()
	if len(all) == 0 {
		return
	}
	conn := c.Conn()
	if conn == nil {
		return // gone again already: the next connection's resync takes over
	}
	slices.SortFunc(all, func(a, b wire.ConvAfter) int { return cmp.Compare(a.Conv, b.Conv) })
	c.wg.Add(1)
	go c.snapshotWorker(conn, all)
}

// snapshotWorker sends the snapshot requests of one resync, one chunk at
// a time, and hands each reply to the event loop.
func (c *Client) snapshotWorker(conn *Conn, all []wire.ConvAfter) {
	defer c.wg.Done()
	for chunk := range slices.Chunk(all, maxSnapshot) {
		ctx, cancel := context.WithTimeout(c.ctx, c.opt.RequestTimeout)
		r, err := conn.Snapshot(ctx, chunk)
		cancel()
		if c.isClosing() {
			return
		}
		c.log.Debug("snapshot", "convs", len(chunk), "err", err)
		c.in.put(snapshotReply{conn: conn, asked: chunk, reply: r, err: err})
	}
}

// onSnapshot applies one snapshot_ok of a resync: it syncs the
// conversations whose head is above the cursor (see resyncAll).
func (c *Client) onSnapshot(s snapshotReply) {
	if s.err != nil {
		select {
		case <-s.conn.Done():
			return // that connection is gone: the next one's resync takes over
		default:
		}
		// A server without snapshot, UNAVAILABLE, a timeout: fall back to
		// one sync per conversation (each with its own retry policy).
		c.log.Info("snapshot failed; syncing each conversation", "convs", len(s.asked), "err", s.err)
		for _, ca := range s.asked {
			if cs := c.known(ca.Conv); cs != nil {
				c.trigger(cs)
			}
		}
		return
	}
	items := make(map[string]*wire.Item, len(s.reply.Items))
	for i := range s.reply.Items {
		items[s.reply.Items[i].Conv] = &s.reply.Items[i]
	}
	for _, ca := range s.asked {
		cs := c.known(ca.Conv)
		if cs == nil {
			continue
		}
		it := items[ca.Conv]
		if it == nil || it.Error != "" {
			// Missing, NOT_MEMBER, CURSOR_AHEAD: the sync knows what to do
			// about each (give up, reset the cursor, retry).
			c.trigger(cs)
			continue
		}
		cs.head = max(cs.head, it.Head)
		// Compared with the cursor now, not the one we asked with: pushes
		// may have moved it meanwhile. Anything committed after the
		// snapshot was read is pushed to this connection.
		if it.Head > cs.cursor.Load() || len(cs.pending) > 0 {
			c.trigger(cs)
		}
	}
}

// onPage applies one sync_ok page.
func (c *Client) onPage(p syncPage) {
	cs := c.known(p.conv)
	if cs == nil || p.gen != cs.gen {
		p.next <- -1
		return
	}
	r := p.reply
	c.log.Debug("sync page", "conv", cs.id, "cursor", cs.cursor.Load(), "head", r.Head, "upto", r.Upto, "more", r.More, "events", len(r.Events), "epoch", r.Epoch)
	if cs.epoch != 0 && r.Epoch != 0 && r.Epoch != cs.epoch {
		// The server lost seq continuity for this conversation: what we
		// hold may not match its log any more. Start over from min_seq.
		c.log.Warn("conversation epoch changed; resyncing from min_seq", "conv", cs.id, "old", cs.epoch, "new", r.Epoch)
		cs.epoch = r.Epoch
		c.reset(cs, max(r.MinSeq-1, 0))
		p.next <- -1
		return
	}
	if r.Epoch != 0 {
		cs.epoch = r.Epoch
	}
	cs.head = max(cs.head, r.Head)
	evs := r.Events
	bySeq := func(a, b wire.Event) int { return cmp.Compare(a.Seq, b.Seq) }
	if !slices.IsSortedFunc(evs, bySeq) {
		evs = slices.SortedFunc(slices.Values(evs), bySeq)
	}
	for _, ev := range evs {
		if ev.Seq > cs.cursor.Load() && ev.Seq <= r.Upto {
			c.deliver(cs, ev)
		}
	}
	// upto also covers the invisible seqs: advance by it, not by the last
	// event.
	if r.Upto > cs.cursor.Load() {
		cs.cursor.Store(r.Upto)
		c.wakeAcker()
	}
	c.drainPending(cs)
	p.next <- cs.cursor.Load()
}

// reset moves cs's cursor back to cursor (new epoch, cursor ahead) and
// makes the running sync stale; a new one starts when it ends.
func (c *Client) reset(cs *convState, cursor int64) {
	cs.gen++
	cs.pending = nil
	cs.cursor.Store(cursor)
	cs.again = true
}

func (c *Client) onSyncDone(d syncDone) {
	cs := c.known(d.conv)
	if cs == nil {
		return
	}
	cs.syncing = false
	err := d.err
	waiters := cs.round
	cs.round = nil
	switch code := wire.CodeOf(err); {
	case d.gen != cs.gen:
		// The cursor was reset (new epoch) while this round ran: it did
		// not finish the job. Its callers wait for the next round.
		cs.again = true
		cs.next = append(waiters, cs.next...)
		waiters = nil
	case err == nil:
		cs.fails = 0
	case code == wire.NotMember:
		// Never a member (or no such conversation): stop syncing it on our
		// own. A push or hint, or an explicit Sync, revives it.
		c.log.Warn("sync: not a member; conversation no longer synced automatically", "conv", cs.id)
		cs.dead, cs.again = err, false
	case code == wire.CursorAhead:
		// Our cursor is beyond the server's head: the stored cursor does
		// not belong to this server's log (a restored database?).
		c.log.Warn("sync: cursor ahead of the conversation's head; resyncing from 0", "conv", cs.id, "cursor", cs.cursor.Load())
		cs.epoch = 0
		c.reset(cs, 0)
		cs.next = append(waiters, cs.next...)
		waiters = nil
	case errors.Is(err, errStalled):
		c.retryLater(cs, stallRetry)
	case errors.Is(err, ErrNotConnected), errors.Is(err, ErrClosed):
		// The next connection's resync takes over.
	default:
		// RATE_LIMITED, UNAVAILABLE, a timeout: try again later.
		delay := c.backoff(cs.fails)
		if we, ok := wire.AsError(err); ok && we.RetryAfterMs > 0 {
			delay = max(delay, time.Duration(we.RetryAfterMs)*time.Millisecond)
		}
		cs.fails++
		c.log.Info("sync failed; retrying", "conv", cs.id, "err", err, "retry_in", delay)
		c.retryLater(cs, delay)
	}
	for _, w := range waiters {
		w <- err
	}
	if cs.again || len(cs.next) > 0 {
		c.trigger(cs)
	}
}

func (c *Client) retryLater(cs *convState, d time.Duration) {
	c.retries[cs.id] = time.Now().Add(d)
}

func (c *Client) armRetries(t *time.Timer) {
	var first time.Time
	for _, at := range c.retries {
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	if first.IsZero() {
		t.Stop()
		return
	}
	t.Reset(max(time.Until(first), 0))
}

func (c *Client) fireRetries() {
	now := time.Now()
	for conv, at := range c.retries {
		if at.After(now) {
			continue
		}
		delete(c.retries, conv)
		if cs := c.known(conv); cs != nil {
			c.trigger(cs)
		}
	}
}

// ---- sync workers ----

// syncWorker pulls conv page by page from after until upto == head,
// handing each page to the event loop, which applies it and says where the
// next page starts.
func (c *Client) syncWorker(conv string, gen int, after int64) {
	defer c.wg.Done()
	err := c.syncPages(conv, gen, after)
	c.log.Debug("sync done", "conv", conv, "from", after, "err", err)
	if c.isClosing() {
		return
	}
	c.in.put(syncDone{conv: conv, gen: gen, err: err})
}

func (c *Client) syncPages(conv string, gen int, after int64) error {
	stalls := 0
	for {
		r, err := c.syncOnce(conv, after)
		if err != nil {
			return err
		}
		next := make(chan int64, 1)
		c.in.put(syncPage{conv: conv, gen: gen, reply: r, next: next})
		var cur int64
		select {
		case cur = <-next:
		case <-c.closing:
			return ErrClientClosed
		}
		if cur < 0 || r.Upto >= r.Head {
			return nil // stale (reset meanwhile), or caught up
		}
		if cur > after {
			after, stalls = cur, 0
			continue
		}
		// more, but upto did not move: the next seq is allocated and not
		// committed yet. It will be committed (or declared a hole by the
		// server) shortly.
		stalls++
		if stalls > stallTries {
			return errStalled
		}
		if !c.sleep(min(stallMin<<(stalls-1), stallMax)) {
			return ErrClientClosed
		}
	}
}

func (c *Client) syncOnce(conv string, after int64) (wire.Message, error) {
	select {
	case c.syncSem <- struct{}{}:
	case <-c.closing:
		return wire.Message{}, ErrClientClosed
	}
	defer func() { <-c.syncSem }()
	conn := c.Conn()
	if conn == nil {
		return wire.Message{}, ErrNotConnected
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.opt.RequestTimeout)
	defer cancel()
	return conn.Sync(ctx, conv, after, c.opt.SyncLimit)
}

// ---- acks ----

func (c *Client) wakeAcker() {
	if !c.opt.AutoAck {
		return
	}
	select {
	case c.ackWake <- struct{}{}:
	default:
	}
}

// ackLoop acks the cursors that moved, at most once per AckDelay.
func (c *Client) ackLoop() {
	defer c.wg.Done()
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case <-c.ackWake:
		case <-c.closing:
			return
		}
		t.Reset(c.opt.AckDelay) // gather what else arrives meanwhile
		select {
		case <-t.C:
		case <-c.closing:
			t.Stop()
			return
		}
		c.flushAcks()
	}
}

func (c *Client) flushAcks() {
	conn := c.Conn()
	if conn == nil {
		return // the next connection wakes us
	}
	if conn != c.ackedOn {
		// A new connection: what was written to the last one may not have
		// reached the server. Ack every conversation again.
		c.ackedOn = conn
		c.mu.Lock()
		for _, cs := range c.convs {
			cs.acked = 0
		}
		c.mu.Unlock()
	}
	type ack struct {
		cs  *convState
		seq int64
	}
	var todo []ack
	reqs := []any{}
	c.mu.Lock()
	for _, cs := range c.convs {
		if cur := cs.cursor.Load(); cur > cs.acked {
			todo = append(todo, ack{cs, cur})
			reqs = append(reqs, &wire.Request{T: wire.TAck, Conv: cs.id, Seq: cur})
		}
	}
	c.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	if len(todo) > maxAcksPerFlush {
		// The server queues at most 256 requests per connection (more are
		// refused with RATE_LIMITED): the rest go one window later.
		todo, reqs = todo[:maxAcksPerFlush], reqs[:maxAcksPerFlush]
		defer c.wakeAcker()
	}
	// Without rid, in one write: the server answers only errors (logged by
	// onFrame; STALE_INSTALL means this install no longer counts), and
	// holds such acks (ack_coalesce), committing the newest of each
	// conversation: acking often costs it little.
	if err := conn.WriteAll(reqs...); err != nil {
		return // connection trouble; the next connection acks again
	}
	for _, a := range todo {
		a.cs.acked = max(a.cs.acked, a.seq)
	}
}

// maxAcksPerFlush is how many acks flushAcks writes per AckDelay window.
const maxAcksPerFlush = 100
