package client

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/parley-im/parley/wire"
)

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
