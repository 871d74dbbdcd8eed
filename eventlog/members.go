package eventlog

import (
	"context"
	"sync"
	"time"

	"github.com/parley-im/parley/store"
)

// memberCache remembers for a few seconds that a user is a current member
// of a conversation, so that a request from a non-member is refused before
// a seq is allocated for it (a refused request must not move head or leave
// holes), without a PostgreSQL round trip per send from members. Only
// positive answers are cached; the commit itself checks membership again,
// so a stale entry costs at most a hole, never a wrong event.
type memberCache struct {
	st  *store.Store
	ttl time.Duration

	mu      sync.Mutex
	entries map[string]time.Time // user "\x00" conv -> expiry
}

const memberCacheMax = 200000

func (m *memberCache) isMember(ctx context.Context, user, conv string) (bool, error) {
	key := user + "\x00" + conv
	now := time.Now()
	m.mu.Lock()
	exp, ok := m.entries[key]
	m.mu.Unlock()
	if ok && now.Before(exp) {
		return true, nil
	}
	member, err := m.st.IsCurrentMember(ctx, conv, user)
	if err != nil || !member {
		return false, err
	}
	m.mu.Lock()
	if m.entries == nil || len(m.entries) >= memberCacheMax {
		m.entries = map[string]time.Time{}
	}
	m.entries[key] = now.Add(m.ttl)
	m.mu.Unlock()
	return true, nil
}

// forget drops the entry (the user left or was removed here).
func (m *memberCache) forget(user, conv string) {
	m.mu.Lock()
	delete(m.entries, user+"\x00"+conv)
	m.mu.Unlock()
}
