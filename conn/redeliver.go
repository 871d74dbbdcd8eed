package conn

import (
	"time"

	"github.com/parley-im/parley/wire"
)

// redelivery tracks, per connection, the conversations whose pushes the
// device has not acked yet. The redelivery scan (OnTick) sends a hint for
// a conversation that stays unacked for longer than redelivery_delay, so a
// push the device lost is repaired without waiting for the user; repeated
// hints back off exponentially (up to 16 × the delay) until an ack covers
// the conversation's newest pushed seq. The session's omu guards it (a
// push takes that lock anyway).
type redelivery struct {
	unacked map[string]*unacked // conv ->
}

type unacked struct {
	seq     int64         // newest seq pushed (or hinted) to the device
	due     time.Time     // when to hint if still unacked
	backoff time.Duration // next wait after a hint
}

// pushed records that seq of conv went to the device.
func (r *redelivery) pushed(conv string, seq int64, now time.Time, delay time.Duration) {
	if r.unacked == nil {
		r.unacked = map[string]*unacked{}
	}
	u := r.unacked[conv]
	if u == nil {
		r.unacked[conv] = &unacked{seq: seq, due: now.Add(delay), backoff: delay}
		return
	}
	u.seq = max(u.seq, seq)
}

// acked records the device's merged cursor.
func (r *redelivery) acked(conv string, delivered int64) {
	if u := r.unacked[conv]; u != nil && delivered >= u.seq {
		delete(r.unacked, conv)
	}
}

// due returns the hints to send now and schedules the next ones.
func (r *redelivery) due(now time.Time, delay time.Duration) []wire.Hint {
	var hints []wire.Hint
	for conv, u := range r.unacked {
		if now.Before(u.due) {
			continue
		}
		hints = append(hints, wire.Hint{T: wire.THint, Conv: conv, Head: u.seq})
		u.backoff = min(2*u.backoff, 16*delay)
		u.due = now.Add(u.backoff)
	}
	return hints
}
