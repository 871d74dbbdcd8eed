package conn

import (
	"context"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/wire"
)

// MentionLimiter limits sends with mention_all per conversation, across
// every gateway (a GCRA limiter in Redis, go-redis's redis_rate): a
// mention of everyone in a big group wakes every member's phone.
type MentionLimiter struct {
	// Static after construction.
	lim    *redis_rate.Limiter
	limit  redis_rate.Limit
	prefix string
}

// NewMentionLimiter allows rate mention_all sends per period in each
// conversation (burst: rate). rate 0 means no limit (nil limiter).
func NewMentionLimiter(rdb redis.UniversalClient, prefix string, rate int, period time.Duration) *MentionLimiter {
	if rate <= 0 || period <= 0 {
		return nil
	}
	return &MentionLimiter{lim: redis_rate.NewLimiter(rdb), prefix: prefix,
		limit: redis_rate.Limit{Rate: rate, Burst: rate, Period: period}}
}

// Allow takes one mention_all of conv; if there is none left it returns
// how long until there is.
func (m *MentionLimiter) Allow(ctx context.Context, conv string) (retryAfter time.Duration, ok bool, err error) {
	if m == nil {
		return 0, true, nil
	}
	// One key per conversation, tagged like the conversation's other keys.
	res, err := m.lim.Allow(ctx, m.prefix+"mention-all:{"+conv+"}", m.limit)
	if err != nil {
		return 0, false, err
	}
	if res.Allowed > 0 {
		return 0, true, nil
	}
	return max(res.RetryAfter, time.Millisecond), false, nil
}

// allowMentionAll answers req (and returns false) if the conversation's
// mention_all budget is spent (RATE_LIMITED with retry_after_ms), or the
// sender is not a member (NOT_MEMBER: outsiders cannot spend a group's
// budget).
func (g *Gateway) allowMentionAll(s *Session, req *wire.Request) bool {
	if g.deps.Mentions == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.RequestTimeout)
	defer cancel()
	if ok, err := g.deps.Log.IsMember(ctx, s.user, req.Conv); err != nil || !ok {
		if err == nil {
			err = store.ErrNotMember
		}
		g.answer(s, req, err, nil)
		return false
	}
	wait, ok, err := g.deps.Mentions.Allow(ctx, req.Conv)
	if err != nil {
		g.answer(s, req, err, nil)
		return false
	}
	if !ok {
		g.answer(s, req, &wire.Error{Code: wire.RateLimited, RetryAfterMs: max(1, wait.Milliseconds()),
			Msg: "mention_all is rate limited in this conversation"}, nil)
		return false
	}
	return true
}
