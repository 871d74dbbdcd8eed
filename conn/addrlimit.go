package conn

import (
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// addrIdle is how long an address's auth bucket is kept after its last
// auth (a full bucket is dropped sooner: it holds nothing to remember).
const addrIdle = time.Minute

// addrLimits are the per-address limits (addr_max_conns, addr_auth_rate,
// addr_auth_burst): how many connections one client address may hold,
// and how fast it may authenticate, so that one address (one host, or
// one abuser) cannot use up the gateway's connections or its auth_rate
// for everyone. Addresses in addr_limit_exempt, and connections without
// an IP address, are not limited.
type addrLimits struct {
	// Static after construction.
	maxConns int
	authRate rate.Limit // 0: no auth limit
	burst    int
	exempt   []netip.Prefix

	mu    sync.Mutex
	conns map[netip.Addr]int           // open connections by address
	auths map[netip.Addr]*rate.Limiter // auth buckets by address
	seen  map[netip.Addr]time.Time     // last auth by address
}

func newAddrLimits(maxConns, authRate, burst int, exempt []netip.Prefix) *addrLimits {
	return &addrLimits{maxConns: maxConns, authRate: rate.Limit(authRate), burst: max(burst, 1), exempt: exempt,
		conns: map[netip.Addr]int{}, auths: map[netip.Addr]*rate.Limiter{}, seen: map[netip.Addr]time.Time{}}
}

// limited reports whether a is subject to the limits.
func (l *addrLimits) limited(a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	for _, p := range l.exempt {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// open counts a connection of a; it reports false (and counts nothing)
// if a already holds addr_max_conns. It returns the address counted
// (invalid when nothing was), to be passed to close.
func (l *addrLimits) open(a netip.Addr) (netip.Addr, bool) {
	if l.maxConns <= 0 || !l.limited(a) {
		return netip.Addr{}, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns[a] >= l.maxConns {
		return netip.Addr{}, false
	}
	l.conns[a]++
	return a, true
}

// close uncounts a connection counted under a (by open).
func (l *addrLimits) close(a netip.Addr) {
	if !a.IsValid() {
		return
	}
	l.mu.Lock()
	if l.conns[a] <= 1 {
		delete(l.conns, a)
	} else {
		l.conns[a]--
	}
	l.mu.Unlock()
}

// admitAuth takes a token of a's auth bucket at now; otherwise it returns
// how long to wait (at least 1 ms).
func (l *addrLimits) admitAuth(a netip.Addr, now time.Time) (time.Duration, bool) {
	if l.authRate <= 0 || !l.limited(a) {
		return 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.auths[a]
	if b == nil {
		b = rate.NewLimiter(l.authRate, l.burst)
		l.auths[a] = b
	}
	l.seen[a] = now
	if b.AllowN(now, 1) {
		return 0, true
	}
	wait := time.Duration((1 - b.TokensAt(now)) / float64(l.authRate) * float64(time.Second))
	return max((wait + time.Millisecond - 1).Truncate(time.Millisecond), time.Millisecond), false
}

// prune forgets the auth buckets of addresses idle for addrIdle, or full
// again (their next auth starts a full bucket anyway).
func (l *addrLimits) prune(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for a, b := range l.auths {
		if now.Sub(l.seen[a]) > addrIdle || b.TokensAt(now) >= float64(l.burst) {
			delete(l.auths, a)
			delete(l.seen, a)
		}
	}
}
