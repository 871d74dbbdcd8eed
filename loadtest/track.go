package loadtest

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// bitset is a growable set of non-negative integers (seqs).
type bitset []uint64

// set adds i and reports whether it was already there.
func (b *bitset) set(i int64) (was bool) {
	w := int(i >> 6)
	if w >= len(*b) {
		n := max(w+1, 2*len(*b), 16)
		nb := make(bitset, n)
		copy(nb, *b)
		*b = nb
	}
	m := uint64(1) << (uint(i) & 63)
	was = (*b)[w]&m != 0
	(*b)[w] |= m
	return was
}

func (b bitset) has(i int64) bool {
	w := int(i >> 6)
	return w < len(b) && b[w]&(uint64(1)<<(uint(i)&63)) != 0
}

// eachNotIn calls f for every i in b that is in none of minus.
func (b bitset) eachNotIn(f func(i int64), minus ...bitset) {
	for w, x := range b {
		for _, m := range minus {
			if w < len(m) {
				x &^= m[w]
			}
		}
		for x != 0 {
			t := bits.TrailingZeros64(x)
			f(int64(w)<<6 | int64(t))
			x &^= 1 << t
		}
	}
}

// Tracker checks delivery: every send confirmed by send_ok must reach
// every other online member device of the conversation, by a push or, after
// a hint, by the sync the hint asks for, and must be pushed at most once
// (after dedupe by (conv, seq)). It keeps exact sets, never estimates.
type Tracker struct {
	convs map[string]*convTrack // static after setup; read concurrently

	confirmed   atomic.Int64 // send_ok replies (dup:false)
	dupReplies  atomic.Int64 // send_ok with dup:true (the tool never resends)
	delivered   atomic.Int64 // unique (conv, seq, device) msg events received, pushed or synced
	synced      atomic.Int64 // of those, received by a sync after a hint (never pushed first)
	duplicated  atomic.Int64 // pushes of a (conv, seq) the device already had
	unexpected  atomic.Int64 // pushes to a device of a conversation it is not tracked in, or of its own send
	expected    atomic.Int64 // deliveries owed: each confirm × (tracked devices − the sender)
	otherEvents atomic.Int64 // pushes of non-msg events (join, leave, recall)
}

// convTrack is one conversation's confirmed seqs and, per member device,
// the seqs it sent and the seqs pushed to it. Each member has its own
// lock, so the pushes of a large group, arriving on many connections at
// once, do not queue on one mutex.
type convTrack struct {
	id      string
	members []*memberTrack // static after setup
	index   map[string]int // device → its index in members

	mu   sync.Mutex // guards sent
	sent bitset     // seqs confirmed to any tracked device
}

// memberTrack is one device in one conversation.
type memberTrack struct {
	device string
	mu     sync.Mutex // guards everything below
	own    bitset     // seqs this device sent (confirmed); it gets send_ok, not a push
	pushed bitset
	synced bitset // seqs received by a sync after a hint
	other  bitset // seqs of non-msg events the device holds (pushed or synced, or its own moderation)
	cursor int64  // the device holds every seq up to here (pushed, synced, its own, other, or before the run)
	acked  int64  // the newest cursor acked
}

// NewTracker returns an empty tracker; add conversations with Track
// before the load starts.
func NewTracker() *Tracker { return &Tracker{convs: map[string]*convTrack{}} }

// Track registers conv, whose head is head before the load, with the
// devices expected to receive its pushes (every member device that is
// connected). Not safe to call concurrently with anything else.
func (t *Tracker) Track(conv string, head int64, devices ...string) *convTrack {
	c := t.convs[conv]
	if c == nil {
		c = &convTrack{id: conv, index: map[string]int{}}
		t.convs[conv] = c
	}
	for _, d := range devices {
		if _, ok := c.index[d]; ok {
			continue
		}
		c.index[d] = len(c.members)
		c.members = append(c.members, &memberTrack{device: d, cursor: head, acked: head})
	}
	return c
}

// ackable moves member i's cursor over the seqs it now holds and returns
// it if it moved past the last ack (then it counts as acked).
func (c *convTrack) ackable(i int) (int64, bool) {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advance()
	if m.cursor <= m.acked {
		return 0, false
	}
	m.acked = m.cursor
	return m.cursor, true
}

// held moves member i's cursor over the seqs it now holds and returns
// it (without counting it as acked).
func (c *convTrack) held(i int) int64 {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advance()
	return m.cursor
}

// Conv returns the tracked conversation or nil.
func (t *Tracker) Conv(id string) *convTrack { return t.convs[id] }

// member returns the index of device in c, or -1.
func (c *convTrack) member(device string) int {
	if i, ok := c.index[device]; ok {
		return i
	}
	return -1
}

// Confirmed records a send_ok for seq sent by member i.
func (t *Tracker) Confirmed(c *convTrack, i int, seq int64, dup bool) {
	if dup {
		t.dupReplies.Add(1)
		return
	}
	m := c.members[i]
	m.mu.Lock()
	m.own.set(seq)
	m.mu.Unlock()
	c.mu.Lock()
	was := c.sent.set(seq)
	c.mu.Unlock()
	if !was {
		t.confirmed.Add(1)
		t.expected.Add(int64(len(c.members) - 1))
	}
}

// Pushed records a push of a msg event at seq to member i. It reports
// whether the push was a new delivery: neither a duplicate, nor the
// device's own send, nor an event the device already read by a sync
// after a hint (a push that raced that sync: its latency is not a
// delivery's).
func (t *Tracker) Pushed(c *convTrack, i int, seq int64) bool {
	m := c.members[i]
	m.mu.Lock()
	own := m.own.has(seq)
	synced := m.synced.has(seq)
	was := m.pushed.set(seq)
	m.mu.Unlock()
	switch {
	case was:
		t.duplicated.Add(1)
		return false
	case own:
		// The sending device gets send_ok instead of a push (docs/protocol.md §4).
		t.unexpected.Add(1)
		return false
	case synced:
		return false
	}
	t.delivered.Add(1)
	return true
}

// Synced records a msg event at seq that member i read with sync (after a
// hint); fromSelf says the device sent it itself.
func (t *Tracker) Synced(c *convTrack, i int, seq int64, fromSelf bool) {
	if fromSelf {
		return
	}
	m := c.members[i]
	m.mu.Lock()
	fresh := !m.pushed.has(seq) && !m.synced.set(seq)
	m.mu.Unlock()
	if fresh {
		t.delivered.Add(1)
		t.synced.Add(1)
	}
}

// cursorOf is member i's contiguous cursor.
func (c *convTrack) cursorOf(i int) int64 {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advance()
	return m.cursor
}

// advance moves the cursor over the seqs the device holds. m.mu must be
// held.
func (m *memberTrack) advance() {
	for m.pushed.has(m.cursor+1) || m.own.has(m.cursor+1) || m.synced.has(m.cursor+1) || m.other.has(m.cursor+1) {
		m.cursor++
	}
}

// Unexpected counts a push the tracker cannot place.
func (t *Tracker) Unexpected() { t.unexpected.Add(1) }

// OtherEvent counts a push of a non-msg event.
func (t *Tracker) OtherEvent() { t.otherEvents.Add(1) }

// Held records that member i holds the non-msg event at seq (an update,
// a leave, an edit: pushed, synced, or answered to the device that made
// it), so its cursor, and the acks that report it, move past that seq.
// It is no delivery: only msg events are owed.
func (t *Tracker) Held(c *convTrack, i int, seq int64) {
	m := c.members[i]
	m.mu.Lock()
	m.other.set(seq)
	m.mu.Unlock()
}

// Lost is one confirmed send that some member device never received.
type Lost struct {
	Conv, Device string
	Seq          int64
}

// Check returns every (conv, seq, device) that was confirmed but neither
// pushed nor synced to the device (which did not send it), up to limit of
// them, the total count of those, and the count of msg events received
// whose send was never confirmed (sends whose reply was lost or late:
// delivered, but not owed).
func (t *Tracker) Check(limit int) (lost []Lost, nLost, nUnconfirmed int64) {
	for _, c := range t.convs {
		c.mu.Lock()
		for _, m := range c.members {
			m.mu.Lock()
			c.sent.eachNotIn(func(seq int64) {
				nLost++
				if len(lost) < limit {
					lost = append(lost, Lost{Conv: c.id, Device: m.device, Seq: seq})
				}
			}, m.own, m.pushed, m.synced)
			m.pushed.eachNotIn(func(int64) { nUnconfirmed++ }, c.sent)
			m.synced.eachNotIn(func(int64) { nUnconfirmed++ }, c.sent, m.pushed)
			m.mu.Unlock()
		}
		c.mu.Unlock()
	}
	return lost, nLost, nUnconfirmed
}

// Matched reports whether every owed delivery has probably arrived (a
// cheap test before the exact one, Lost).
func (t *Tracker) Matched() bool { return t.delivered.Load() >= t.expected.Load() }
