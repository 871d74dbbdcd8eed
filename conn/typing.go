package conn

import (
	"context"
	"time"

	"github.com/parley-im/parley/fanout"
	"github.com/parley-im/parley/wire"
)

// typingInterval: at most one typing frame per (device, conversation) is
// relayed per interval; the others are dropped silently.
const typingInterval = 2 * time.Second

// typing relays "user is typing" to the other current members' online
// devices, in push-tier conversations only (in bigger ones it is skipped
// silently). Nothing is stored; there is no success reply.
func (g *Gateway) typing(s *Session, req *wire.Request, now time.Time) {
	r := *req // the caller's may be reused once this returns
	g.members.load(req.Conv, now, func(members []string, err error) {
		if err != nil {
			g.answer(s, &r, err, nil)
			return
		}
		g.relayTyping(s, &r, members, now)
	})
}

// typingOnLoop relays a typing frame right from the event loop, without a
// request goroutine, unless requests of the connection are queued before
// it (they go first); it reports whether it took the frame.
func (g *Gateway) typingOnLoop(s *Session, req *wire.Request, now time.Time) bool {
	s.qmu.Lock()
	busy := s.running
	s.qmu.Unlock()
	if busy || s.expired(now) {
		return false
	}
	g.typing(s, req, now)
	return true
}

// relayTyping relays a typing frame of s's user in conv, whose current
// members are members.
func (g *Gateway) relayTyping(s *Session, req *wire.Request, members []string, now time.Time) {
	if !isMemberOf(members, s.user) {
		g.answer(s, req, wire.Errorf(wire.NotMember, "not a member of this conversation"), nil)
		return
	}
	if fanout.TierOf(int64(len(members)), g.cfg.WriteFanoutMax, g.cfg.OnlineFanoutMax) != fanout.TierPush {
		g.metrics.typing.WithLabelValues("skipped_tier").Inc()
		return
	}
	if !s.allowTyping(req.Conv, now) {
		g.metrics.typing.WithLabelValues("dropped_rate").Inc()
		return
	}
	frame, err := wire.AppendFrame(nil, wire.Typing{T: wire.TTyping, Conv: req.Conv, User: s.user})
	if err != nil {
		g.answer(s, req, err, nil)
		return
	}
	if err := g.toOthers(context.Background(), members, s.user, frame); err != nil {
		g.metrics.typing.WithLabelValues("dropped_busy").Inc()
		return
	}
	g.metrics.typing.WithLabelValues("relayed").Inc()
}

// toOthers sends frame to the online devices of members other than
// user, best effort (ToUsers never waits).
func (g *Gateway) toOthers(ctx context.Context, members []string, user string, frame []byte) error {
	others := make([]string, 0, len(members))
	for _, u := range members {
		if u != user {
			others = append(others, u)
		}
	}
	if len(others) == 0 {
		return nil
	}
	if g.deps.ToUsers != nil {
		return g.deps.ToUsers(others, frame)
	}
	for _, u := range others {
		if err := g.deps.ToUser(ctx, u, "", frame); err != nil {
			return err
		}
	}
	return nil
}

// allowTyping reports whether a typing frame of this connection in conv
// may be relayed now (one per typingInterval).
func (s *Session) allowTyping(conv string, now time.Time) bool {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if last, ok := s.typingLast[conv]; ok && now.Sub(last) < typingInterval {
		return false
	}
	if s.typingLast == nil {
		s.typingLast = map[string]time.Time{}
	}
	if len(s.typingLast) >= 64 { // bounded: forget conversations idle for an interval
		for c, t := range s.typingLast {
			if now.Sub(t) >= typingInterval {
				delete(s.typingLast, c)
			}
		}
	}
	s.typingLast[conv] = now
	return true
}
