package conn

import (
	"testing"
	"time"

	"github.com/parley-im/parley/fanout"
	"github.com/parley-im/parley/wire"
)

// TestNoticesApplyToAuthsInFlight: a revocation or suspension that
// arrived after an auth started applies to it (the auth may have read
// the row before the change committed); one that arrived before does not
// (the auth read the row after it, and a later change would be a new
// notice); an unsuspension cancels the suspension's notice.
func TestNoticesApplyToAuthsInFlight(t *testing.T) {
	var n notices
	t0 := time.Now()
	n.add(fanout.Lifecycle{Device: "d1", User: "u1", Reason: wire.KickRevoked}, t0)
	n.add(fanout.Lifecycle{User: "u2", Reason: wire.KickSuspended}, t0)
	for _, c := range []struct {
		device, user string
		start        time.Time
		want         string
	}{
		{"d1", "u1", t0.Add(-time.Millisecond), wire.KickRevoked},
		{"d1", "u1", t0, wire.KickRevoked},
		{"d1", "u1", t0.Add(time.Millisecond), ""},
		{"d2", "u2", t0.Add(-time.Millisecond), wire.KickSuspended},
		{"d2", "u2", t0.Add(time.Millisecond), ""},
		{"d3", "u3", t0.Add(-time.Hour), ""},
	} {
		if got := n.since(c.device, c.user, c.start); got != c.want {
			t.Errorf("since(%s, %s, %v): %q, want %q", c.device, c.user, c.start.Sub(t0), got, c.want)
		}
	}
	n.add(fanout.Lifecycle{User: "u2", Reason: "unsuspended"}, t0.Add(time.Second))
	if got := n.since("d2", "u2", t0.Add(-time.Millisecond)); got != "" {
		t.Errorf("after unsuspend: %q", got)
	}
	n.prune(t0.Add(noticeKeep + time.Second))
	if got := n.since("d1", "u1", t0.Add(-time.Millisecond)); got != "" {
		t.Errorf("after prune: %q", got)
	}
}
