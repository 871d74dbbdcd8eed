package conn

import (
	"math/rand/v2"
	"time"

	"golang.org/x/time/rate"
)

// Retry times handed to refused auths: never more than maxAuthRetry, and
// each spread by up to authJitterMin plus a quarter of the wait.
const (
	maxAuthRetry  = 30 * time.Second
	authJitterMin = 50 * time.Millisecond
)

// authLimiter is the gateway's auth rate limit (auth_rate, auth_burst): a
// token bucket checked on the event loop when an auth arrives, before any
// database lookup.
//
// A refused auth is told when to come back (retry_after_ms). Telling every
// refused device the bucket's next refill would bring them all back as one
// wave, to be refused again but for a few. Instead, the refused devices
// of an overload get consecutive places in line from a second bucket that
// refills at the same rate (queue): the n-th refusal gets about
// n/auth_rate, so they come back at about the rate the bucket admits
// them. Each place is then spread by a random jitter (up to
// authJitterMin + wait/4), so that devices refused at the same instant do
// not come back at the same instant either.
type authLimiter struct {
	bucket *rate.Limiter // admits auths
	queue  *rate.Limiter // hands out the refused devices' return slots
}

// newAuthLimiter returns nil (no limit) for perSec <= 0.
func newAuthLimiter(perSec, burst int) *authLimiter {
	if perSec <= 0 {
		return nil
	}
	return &authLimiter{
		bucket: rate.NewLimiter(rate.Limit(perSec), max(burst, 1)),
		queue:  rate.NewLimiter(rate.Limit(perSec), 1),
	}
}

// admit takes a token for an auth at now. Otherwise it returns how long
// the refused device should wait before it tries again: at least 1 ms.
func (l *authLimiter) admit(now time.Time) (time.Duration, bool) {
	if l == nil || l.bucket.AllowN(now, 1) {
		return 0, true
	}
	// The bucket's wait for its next token, plus the device's place in
	// line behind the devices refused before it.
	wait := time.Duration((1 - l.bucket.TokensAt(now)) / float64(l.bucket.Limit()) * float64(time.Second))
	slot := l.queue.ReserveN(now, 1)
	if d := slot.DelayFrom(now); wait+d > maxAuthRetry {
		slot.CancelAt(now) // the line does not grow past what we tell
		wait = maxAuthRetry
	} else {
		wait += d
	}
	wait += rand.N(authJitterMin + wait/4)
	// In whole milliseconds, rounded up: never back before the token.
	return max((wait + time.Millisecond - 1).Truncate(time.Millisecond), time.Millisecond), false
}
