package conn

import (
	"sync"
	"time"

	"github.com/parley-im/parley/fanout"
	"github.com/parley-im/parley/wire"
)

// noticeKeep is how long a lifecycle notice is remembered for auths that
// were already in flight when it arrived (an auth takes at most
// request_timeout; this is well above it).
const noticeKeep = time.Minute

// notices remembers recent lifecycle notices (revoked devices, suspended
// users) with the time each arrived. An auth that read the device's row
// before a revocation committed, but registers its connection only after
// the notice went by, is kicked by looking here: a notice that arrived
// after the auth started applies to it.
type notices struct {
	mu      sync.Mutex
	devices map[string]time.Time // device -> when its revocation arrived
	users   map[string]time.Time // user -> when its suspension arrived
}

func (n *notices) add(l fanout.Lifecycle, now time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.devices == nil {
		n.devices, n.users = map[string]time.Time{}, map[string]time.Time{}
	}
	switch {
	case l.Device != "":
		n.devices[l.Device] = now
	case l.Reason == wire.KickSuspended:
		n.users[l.User] = now
	case l.Reason == "unsuspended":
		delete(n.users, l.User)
	}
}

// since returns the kick reason of a notice about device or user that
// arrived at or after start, or "".
func (n *notices) since(device, user string, start time.Time) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if at, ok := n.devices[device]; ok && !at.Before(start) {
		return wire.KickRevoked
	}
	if at, ok := n.users[user]; ok && !at.Before(start) {
		return wire.KickSuspended
	}
	return ""
}

func (n *notices) prune(now time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, at := range n.devices {
		if now.Sub(at) > noticeKeep {
			delete(n.devices, k)
		}
	}
	for k, at := range n.users {
		if now.Sub(at) > noticeKeep {
			delete(n.users, k)
		}
	}
}

// Lifecycle obeys a lifecycle notice from the bus: the revoked device's
// connection, or the suspended user's connections, on this gateway get
// a kick and are closed.
func (g *Gateway) Lifecycle(l fanout.Lifecycle) {
	g.notices.add(l, time.Now())
	if l.Reason == "unsuspended" {
		return
	}
	reason := wire.KickRevoked
	if l.Device == "" {
		reason = wire.KickSuspended
	}
	var kick []*Session
	g.mu.RLock()
	if l.Device != "" {
		if s := g.devices[l.Device]; s != nil {
			kick = append(kick, s)
		}
	} else {
		for _, s := range g.devices {
			if s.user == l.User {
				kick = append(kick, s)
			}
		}
	}
	g.mu.RUnlock()
	for _, s := range kick {
		g.metrics.kicks.WithLabelValues(reason).Inc()
		s.kickOut(reason)
	}
}
