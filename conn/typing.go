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
func (g *Gateway) typing(ctx context.Context, s *Session, req *wire.Request, now time.Time) {
	members, err := g.members.get(ctx, req.Conv, now)
	if err != nil {
		g.answer(s, req, err, nil)
		return
	}
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
	if err := g.toOthers(ctx, members, s.user, frame); err != nil {
		g.metrics.typing.WithLabelValues("dropped_busy").Inc()
		return
	}
	g.metrics.typing.WithLabelValues("relayed").Inc()
}

// toOthers sends frame to the online devices of members other than
// user, best effort (NotifyMany never waits).
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
	if g.deps.NotifyMany != nil {
		return g.deps.NotifyMany(others, frame)
	}
	for _, u := range others {
		if err := g.deps.Notify(ctx, u, "", frame); err != nil {
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
