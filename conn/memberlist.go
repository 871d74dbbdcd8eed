package conn

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/parley-im/parley/store"
)

// memberLists caches conversations' current member lists for what is
// relayed without being stored (typing, receipts): a typing frame must
// not cost a PostgreSQL query. A join or a removal, in any process, drops
// the conversation's entry at once (Gateway.ForgetMembers, told by the
// bus before the change is pushed), so a removed user stops getting them
// right away and a new member gets them from its join on. memberListTTL
// only bounds what a lost notice (the bus is Redis pub/sub) can cost:
// with 2 s, 8,000 groups typing cost 4,000 queries/s, half of parleyd's
// CPU and half a core of PostgreSQL.
//
// Lists not cached are loaded in batches, one statement for every
// conversation asked for meanwhile, by a loader goroutine, and the asker
// is called back: a connection never waits for PostgreSQL to relay a
// typing frame, and after a restart, with every list to load at once,
// thousands of conversations cost a few statements a second instead of a
// query each (8,000 groups took seconds, and typing frames waited as
// long).
type memberLists struct {
	st    *store.Store
	spawn func(func()) // starts the loader (Gateway.goroutine)

	mu sync.Mutex
	m  map[string]memberList // guarded by mu
	// The conversations forgotten while the loader's statement ran
	// (guarded by mu; nil when none runs): their lists as read may be
	// older than the change, and are not kept.
	forgotten map[string]struct{}
	// The conversations to load, in order, and who waits for each
	// (guarded by mu); loading: the loader runs.
	pending []string
	waiting map[string][]func([]string, error)
	loading bool
}

type memberList struct {
	users []string // sorted
	at    time.Time
}

const (
	memberListTTL  = 30 * time.Second
	memberListMax  = 100000 // entries kept before old ones are swept
	memberLoadMax  = 1000   // conversations loaded by one statement
	memberLoadWait = 10 * time.Second
)

// load calls done with conv's current members (sorted; none for a
// conversation that does not exist): at once if they are cached, else
// from the loader's goroutine once they are loaded.
func (l *memberLists) load(conv string, now time.Time, done func([]string, error)) {
	l.mu.Lock()
	if e, ok := l.m[conv]; ok && now.Sub(e.at) < memberListTTL {
		l.mu.Unlock()
		done(e.users, nil)
		return
	}
	if l.waiting == nil {
		l.waiting = map[string][]func([]string, error){}
	}
	if len(l.waiting[conv]) == 0 {
		l.pending = append(l.pending, conv)
	}
	l.waiting[conv] = append(l.waiting[conv], done)
	start := !l.loading
	l.loading = true
	l.mu.Unlock()
	if start {
		l.spawn(l.loader)
	}
}

// get returns conv's current members, waiting for them to be loaded if
// they are not cached.
func (l *memberLists) get(ctx context.Context, conv string, now time.Time) ([]string, error) {
	type result struct {
		users []string
		err   error
	}
	ch := make(chan result, 1)
	l.load(conv, now, func(users []string, err error) { ch <- result{users, err} })
	select {
	case r := <-ch:
		return r.users, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// loader loads the pending conversations, a batch per statement, until
// none is left.
func (l *memberLists) loader() {
	for {
		l.mu.Lock()
		n := min(len(l.pending), memberLoadMax)
		if n == 0 {
			l.loading = false
			l.mu.Unlock()
			return
		}
		convs := slices.Clone(l.pending[:n])
		l.pending = l.pending[n:]
		l.forgotten = map[string]struct{}{}
		l.mu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), memberLoadWait)
		lists, err := l.st.CurrentMembersOf(ctx, convs)
		cancel()
		now := time.Now()

		l.mu.Lock()
		if err == nil {
			l.sweepLocked(now, len(convs))
		}
		waiters := make([][]func([]string, error), len(convs))
		for i, c := range convs {
			users := lists[c]
			slices.Sort(users)
			if _, changed := l.forgotten[c]; err == nil && !changed {
				l.m[c] = memberList{users: users, at: now}
			}
			waiters[i] = l.waiting[c]
			delete(l.waiting, c)
		}
		l.forgotten = nil
		l.mu.Unlock()
		for i, c := range convs {
			for _, done := range waiters[i] {
				done(lists[c], err)
			}
		}
	}
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
	if l.forgotten != nil {
		l.forgotten[conv] = struct{}{}
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
