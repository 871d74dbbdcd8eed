package conn

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/batch"
	"github.com/parley-im/parley/store"
)

// memberLists caches conversations' current member lists for what is
// relayed without being stored (typing, receipts): a typing frame must
// not cost a PostgreSQL query. A join or a removal, in any process, drops
// the conversation's entry at once (Gateway.ForgetMembers, told by the
// bus before the change is pushed), so a removed user stops getting them
// right away and a new member gets them from its join on. memberListTTL
// only bounds what a lost notice (the bus is Redis pub/sub) can cost:
// with a short TTL, every typing group's list is read again that often,
// and with many groups typing those reads took much of parleyd's CPU and
// of PostgreSQL's (BENCHMARKS.md, the row "ad8aedf against 0d1141f").
//
// Lists not cached are read by the gateway's combined reads (loads: one
// statement for every conversation asked for meanwhile), and a typing
// frame waits for its list on a goroutine of its own, not on its
// connection: after a restart, with every list to read at once,
// thousands of conversations cost a few statements instead of a query
// each (with a query each, typing frames waited behind them: the same
// row).
type memberLists struct {
	loads batch.Combiner[string, []string] // set by initCombiners
	spawn func(func())                     // starts a goroutine (Gateway.goroutine)

	mu sync.Mutex
	m  map[string]memberList // guarded by mu
	// One set per statement running (guarded by mu): the conversations
	// forgotten while it ran, whose lists as read may be older than the
	// change and are not kept.
	reading map[*map[string]struct{}]struct{}
}

type memberList struct {
	users []string // sorted
	at    time.Time
}

const (
	memberListTTL = 30 * time.Second
	memberListMax = 100000 // entries kept before old ones are swept
)

// cached returns conv's list if it is cached and fresh.
func (l *memberLists) cached(conv string, now time.Time) ([]string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.m[conv]
	if !ok || now.Sub(e.at) >= memberListTTL {
		return nil, false
	}
	return e.users, true
}

// load calls done with conv's current members (sorted; none for a
// conversation that does not exist): at once if they are cached, else
// from a goroutine of its own once they are read.
func (l *memberLists) load(conv string, now time.Time, done func([]string, error)) {
	if users, ok := l.cached(conv, now); ok {
		done(users, nil)
		return
	}
	l.spawn(func() {
		ctx, cancel := context.WithTimeout(context.Background(), memberLoadWait)
		defer cancel()
		done(l.loads.Do(ctx, conv))
	})
}

// memberLoadWait bounds how long a relay waits for its list.
const memberLoadWait = 10 * time.Second

// get returns conv's current members, waiting for them to be read if
// they are not cached.
func (l *memberLists) get(ctx context.Context, conv string, now time.Time) ([]string, error) {
	if users, ok := l.cached(conv, now); ok {
		return users, nil
	}
	return l.loads.Do(ctx, conv)
}

// getMany returns the current members of each of convs that could be
// read (nil for a conversation that does not exist), reading those not
// cached in statements of up to memberLoadMax (the combined read's own
// Run: the caller already holds them all together, so there is nothing
// to wait for another request to join).
func (l *memberLists) getMany(ctx context.Context, convs []string, now time.Time) map[string][]string {
	out := make(map[string][]string, len(convs))
	var missing []string
	for _, c := range convs {
		if users, ok := l.cached(c, now); ok {
			out[c] = users
		} else {
			missing = append(missing, c)
		}
	}
	for len(missing) > 0 {
		part := missing[:min(len(missing), memberLoadMax)]
		missing = missing[len(part):]
		lists, err := l.loads.Run(ctx, part)
		if err != nil {
			continue // those conversations are left out
		}
		for i, c := range part {
			out[c] = lists[i]
		}
	}
	return out
}

// read is the combined read: the lists of convs in one statement, kept
// in the cache unless forgotten meanwhile.
func (l *memberLists) read(ctx context.Context, st *store.Store, convs []string) ([][]string, error) {
	forgotten := map[string]struct{}{}
	l.mu.Lock()
	if l.reading == nil {
		l.reading = map[*map[string]struct{}]struct{}{}
	}
	l.reading[&forgotten] = struct{}{}
	l.mu.Unlock()
	lists, err := st.CurrentMembersOf(ctx, convs)
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.reading, &forgotten)
	if err != nil {
		return nil, err
	}
	l.sweepLocked(now, len(convs))
	out := make([][]string, len(convs))
	for i, c := range convs {
		users := lists[c]
		slices.Sort(users)
		if _, changed := forgotten[c]; !changed {
			l.m[c] = memberList{users: users, at: now}
		}
		out[i] = users
	}
	return out, nil
}

// sweepLocked makes room for n more entries. l.mu is held.
func (l *memberLists) sweepLocked(now time.Time, n int) {
	if l.m == nil {
		l.m = map[string]memberList{}
	}
	if len(l.m)+n < memberListMax {
		return
	}
	for k, v := range l.m {
		if now.Sub(v.at) >= memberListTTL {
			delete(l.m, k)
		}
	}
}

// forget drops conv's cached list.
func (l *memberLists) forget(conv string) {
	l.mu.Lock()
	delete(l.m, conv)
	for set := range l.reading {
		(*set)[conv] = struct{}{}
	}
	l.mu.Unlock()
}

// ForgetMembers drops what the gateway caches of conv's members (some
// joined or left it, here or on another gateway).
func (g *Gateway) ForgetMembers(conv string) { g.members.forget(conv) }

func isMemberOf(users []string, user string) bool {
	_, ok := slices.BinarySearch(users, user)
	return ok
}
