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
// not cost a PostgreSQL query. An entry lives memberListTTL, and a removal
// (heard from any gateway, Gateway.ForgetMembers) drops it at once, so a
// removed user stops getting them right away; a new member may miss them
// for up to the TTL.
type memberLists struct {
	st *store.Store

	mu sync.Mutex
	m  map[string]memberList // guarded by mu
}

type memberList struct {
	users []string // sorted
	at    time.Time
}

const (
	memberListTTL = 2 * time.Second
	memberListMax = 100000 // entries kept before old ones are swept
)

// get returns conv's current members (sorted); none for a conversation
// that does not exist.
func (l *memberLists) get(ctx context.Context, conv string, now time.Time) ([]string, error) {
	l.mu.Lock()
	e, ok := l.m[conv]
	l.mu.Unlock()
	if ok && now.Sub(e.at) < memberListTTL {
		return e.users, nil
	}
	ps, err := l.st.CurrentMembers(ctx, conv)
	if err != nil {
		return nil, err
	}
	users := make([]string, len(ps))
	for i, p := range ps {
		users[i] = p.User
	}
	slices.Sort(users)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]memberList{}
	}
	if len(l.m) >= memberListMax {
		for k, v := range l.m {
			if now.Sub(v.at) >= memberListTTL {
				delete(l.m, k)
			}
		}
	}
	l.m[conv] = memberList{users: users, at: now}
	return users, nil
}

// forget drops conv's cached list.
func (l *memberLists) forget(conv string) {
	l.mu.Lock()
	delete(l.m, conv)
	l.mu.Unlock()
}

// ForgetMembers drops what the gateway caches of conv's members (some
// left it, here or on another gateway).
func (g *Gateway) ForgetMembers(conv string) { g.members.forget(conv) }

func isMemberOf(users []string, user string) bool {
	_, ok := slices.BinarySearch(users, user)
	return ok
}
