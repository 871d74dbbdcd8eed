package conn

import (
	"sync"
	"time"

	"github.com/parley-im/parley/internal/periodic"
)

// coalescer holds the sessions whose outbox has frames that may wait for
// its flush, and flushes them all every period: big groups' pushes
// (config push_coalesce), typing and receipts (relay_coalesce). A device
// given several such frames within the period gets them in one write. On
// loopback TCP a write costs the sender much the same CPU whatever its
// size (BENCHMARKS.md, the row "at d383c31" on the CPU one `write`
// costs), so this is what bounds CPU per delivery for big groups
// (docs/fanout.md) and per relayed typing frame.
type coalescer struct {
	bit uint8 // this coalescer's bit of Session.coalescing

	mu       sync.Mutex
	sessions []*Session
}

// The two coalescers' bits of Session.coalescing.
const (
	pushCoalescer  uint8 = 1
	relayCoalescer uint8 = 2
)

// add queues s for the next flush unless it is queued already. s.omu is
// held.
func (c *coalescer) add(s *Session) {
	if s.coalescing&c.bit != 0 {
		return
	}
	s.coalescing |= c.bit
	c.mu.Lock()
	c.sessions = append(c.sessions, s)
	c.mu.Unlock()
}

// flush schedules the write of every queued session's outbox.
func (c *coalescer) flush() {
	c.mu.Lock()
	ss := c.sessions
	c.sessions = nil
	c.mu.Unlock()
	for _, s := range ss {
		s.omu.Lock()
		s.coalescing &^= c.bit
		s.flushLocked()
		s.omu.Unlock()
	}
}

// every runs f every period until the gateway stops, and once more then.
// Its phase is 0: fan-out's dense_seq advance and the event log's
// membership refresh run at other phases (fanout.New, memberCache).
func (g *Gateway) every(period time.Duration, f func()) {
	periodic.Run(g.stopping, period, 0, f)
	f()
}
