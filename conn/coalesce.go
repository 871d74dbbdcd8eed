package conn

import (
	"sync"
	"time"

	"github.com/parley-im/parley/internal/periodic"
)

// coalescer holds the sessions whose outbox has coalesced pushes (big
// groups' pushes, config push_coalesce) and flushes them all every
// push_coalesce: a device pushed several such messages within the period
// gets them in one write. On loopback TCP a write costs the sender about
// 5 µs of CPU whatever its size, so this is what bounds CPU per delivery
// for big groups (docs/fanout.md).
type coalescer struct {
	mu       sync.Mutex
	sessions []*Session
}

// add queues s for the next flush. s.omu is held (s.coalescing was
// false).
func (c *coalescer) add(s *Session) {
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
		s.coalescing = false
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
