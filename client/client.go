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
//   - the supervisor (supervise, supervisor.go): dials, authenticates,
//     waits for the connection to end, backs off, dials again;
//   - the event loop (loop, loop.go): the only goroutine that touches
//     conversation state and the only one that calls OnEvent,
//     OnReadChanged and OnState. It never does network I/O, so a slow
//     round trip never delays the delivery of pushes of other
//     conversations;
//   - sync workers (syncWorker, syncworkers.go), at most one per
//     conversation at a time and at most maxSyncs doing a request at once:
//     they send sync requests and hand every page to the loop;
//   - after each (re)connect, a snapshot worker (snapshotWorker, loop.go)
//     that asks for the heads of every known conversation and hands the
//     replies to the loop;
//   - the acker (ackLoop, acks.go), with Options.AutoAck;
//   - the reader goroutine of the current Conn (conn.go).
//
// Close stops them all and waits for them. This file holds the Client's
// types, its lifecycle and Send; requests.go holds the thin request
// wrappers.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
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
	// ErrRevoked: the device was revoked or its token rotated (kick
	// "revoked"); the client stops: the app must log in again.
	ErrRevoked = errors.New("client: the device was revoked")
	// ErrSuspended: the user was suspended (kick "suspended"); the client stops.
	ErrSuspended = errors.New("client: the user is suspended")
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
	Addr   string // host:port of a Parley gateway, or its WebSocket URL (ws://host:port/v1/ws)
	Device string // device id
	Token  string // the device's token

	// JWT, if set, authenticates with the JSON Web Token it returns
	// instead of Device and Token (docs/auth.md). It is called for every
	// connection, and again RefreshBefore ahead of the session's
	// expires_at to refresh it in place; it should return a token with a
	// later exp each time (e.g. from the app's login server).
	JWT func(ctx context.Context) (string, error)
	// RefreshBefore is how long before expires_at a JWT session is
	// refreshed (default 1 min, at most half the session's life).
	RefreshBefore time.Duration

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
	// messages, joins, leaves, recalls (a recall's Target is the seq of
	// the message to blank; the message itself, if synced later, comes
	// with Recalled set and an empty body), edits and updates (a role,
	// member mute, ban or group setting changed: ev.Update says what, for
	// ev.Users). The client's own sends are delivered too. A leave whose
	// Users include this user (it left, or a moderator removed or banned
	// it) is the last event of that membership: nothing newer of the
	// conversation arrives until the user is added again.
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
	// (ErrReplaced, ErrRevoked, ErrSuspended, the AUTH_FAILED or
	// SUSPENDED *wire.Error, or nil after Close).
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
	// TLS, if set, wraps the connections in TLS (as DialOptions.TLS).
	TLS *tls.Config
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
