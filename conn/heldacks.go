package conn

import (
	"context"
	"sync"
	"time"

	"github.com/parley-im/parley/cursor"
	"github.com/parley-im/parley/wire"
)

// Held acks (config ack_coalesce).
//
// An ack without rid is fire-and-forget: the client is told nothing on
// success, so nothing says it is durable yet. A device that acks as it
// receives (client AutoAck, every 50 ms by default) acks a busy
// conversation many times a second, and each ack was a row written to
// PostgreSQL. Such an ack of a seq this connection was given (so it cannot
// fail but for STALE_INSTALL, which fails every ack of the connection
// alike) is held instead: per conversation only the newest is kept, and
// the gateway hands the held acks to the commit queue every ack_coalesce.
// Any other ack (with rid, or of a seq the connection was not given) goes
// to the commit queue at once, after the connection's held acks, so its
// reply carries their merge; convs and snapshot, which report this
// device's cursors, first wait for the held acks to commit. A connection
// that closes hands its held acks over at once.

// heldAcks is the set of sessions that hold acks.
type heldAcks struct {
	mu       sync.Mutex
	sessions map[*Session]struct{}
}

// add records that s holds acks.
func (h *heldAcks) add(s *Session) {
	h.mu.Lock()
	if h.sessions == nil {
		h.sessions = map[*Session]struct{}{}
	}
	h.sessions[s] = struct{}{}
	h.mu.Unlock()
}

// take empties the set and returns what it held.
func (h *heldAcks) take() map[*Session]struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	ss := h.sessions
	h.sessions = nil
	return ss
}

// holdAck keeps a (a rid-less ack of a seq the connection was given) until
// the next flush, replacing an older held ack of the same conversation.
func (s *Session) holdAck(a cursor.Ack) {
	s.amu.Lock()
	first := len(s.held) == 0
	if s.held == nil {
		s.held = map[string]cursor.Ack{}
	}
	if prev, ok := s.held[a.Conv]; !ok || a.Seq > prev.Seq {
		s.held[a.Conv] = a
	}
	s.amu.Unlock()
	// The redelivery scan counts it now (ack_coalesce may be longer than
	// redelivery_delay): it can fail only as STALE_INSTALL, and then no
	// hint is due to this connection anyway.
	s.acked(a.Conv, a.Seq)
	s.g.metrics.acksHeld.Inc()
	if first {
		s.g.held.add(s)
	}
	if s.closed.Load() {
		// Closed while this ack was handled: OnClose's flush may have
		// run before it was held.
		s.flushAcks(nil)
	}
}

// flushAcks hands the held acks to the commit queue and says how many. If
// wg is not nil, it is Done once for each of them when it committed or
// failed.
func (s *Session) flushAcks(wg *sync.WaitGroup) int {
	s.amu.Lock()
	held := s.held
	s.held = nil
	s.amu.Unlock()
	for _, a := range held {
		if wg != nil {
			wg.Add(1)
		}
		s.g.metrics.acksFlushed.Inc()
		s.g.mergeAck(s, a, "", time.Time{}, wg)
	}
	return len(held)
}

// settleAcks flushes the held acks and waits (at most until ctx is done)
// until they committed, so what the request reads next includes them.
func (s *Session) settleAcks(ctx context.Context) {
	var wg sync.WaitGroup
	if s.flushAcks(&wg) == 0 {
		return
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// mergeAck queues a for commit and answers it (rid "": errors only). start
// (if not zero) is when the request arrived; wg (if not nil) is Done after
// the answer.
func (g *Gateway) mergeAck(s *Session, a cursor.Ack, rid string, start time.Time, wg *sync.WaitGroup) {
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.RequestTimeout)
	g.deps.Cursors.Merge(ctx, s.id, a, func(r cursor.Result) {
		cancel()
		if r.Err == nil {
			s.acked(a.Conv, r.Delivered)
		}
		if !start.IsZero() {
			g.metrics.latency.WithLabelValues(wire.TAck).Observe(time.Since(start).Seconds())
		}
		g.answer(s, &wire.Request{T: wire.TAck, Rid: rid, Conv: a.Conv}, r.Err, wire.AckOK{T: wire.TAckOK, Rid: rid, Conv: a.Conv, Delivered: r.Delivered})
		if wg != nil {
			wg.Done()
		}
	})
}

// flushHeldAcks hands every session's held acks to the commit queue.
func (g *Gateway) flushHeldAcks() {
	for s := range g.held.take() {
		s.flushAcks(nil)
	}
}
