package client

import (
	"time"

	"github.com/parley-im/parley/wire"
)

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
