package eventlog

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/batch"
	"github.com/parley-im/parley/internal/periodic"
	"github.com/parley-im/parley/store"
)

// memberCache remembers for a few seconds that a user is a current member
// of a conversation (and until when it is muted there), so that a request
// from a non-member, or a send from a muted member, is refused before
// a seq is allocated for it (a refused request must not move head or leave
// holes), without a PostgreSQL round trip per send from members. Only
// positive answers are used from the cache (a cached mute is looked up
// again before a send is refused); the commit itself checks membership again,
// (and the mute), so a stale entry costs at most a hole, never a wrong
// event (docs/consistency.md, "Membership changes and sends"), and a
// removal, mute or role change in any process drops the user's entries
// everywhere (Log.Forget, called from the bus).
//
// An entry that was used is looked up again in the background before it
// expires (refreshLoop: one statement for every entry due), so a sender
// who keeps sending never waits for PostgreSQL here. Entries expiring
// together used to send every active sender's next send to PostgreSQL in
// the same instant, every ttl: a latency spike at every expiry, which
// showed in send_ok p99 (BENCHMARKS.md, the row
// "1e07127 against its parent"). An entry nobody used since its last
// lookup expires, and the next send looks it up again. Either way an
// answer is at most ttl old.
type memberCache struct {
	st  *store.Store
	ttl time.Duration

	mu      sync.Mutex
	entries map[memberKey]*memberEntry
	// The keys asked for since their last lookup: refresh looks at these
	// only, not at every entry (an entry nobody asks for again just
	// expires, and is replaced or dropped by the next lookup of its key).
	used map[memberKey]struct{}

	counts MemberLookups // lookups made on a send's path and by refresh
	// forgot: when each key was last forgotten (pruned after forgetKeep).
	// A lookup or refresh whose read began before that may have read the
	// state the forget is about, and does not store its answer.
	forgot map[memberKey]time.Time

	// misses reads the keys that sends wait for, many in one statement:
	// after a start, a Redis flush or a wave of forgets, thousands of
	// senders' first sends miss at once, and one round trip each (with
	// PostgreSQL planning each anew) stalled a core for seconds.
	misses batch.Combiner[memberKey, store.MemberState]
}

// defaultMemberTTL: removals, mutes and role changes drop entries on every
// gateway at once (Log.Forget, over the bus), so the TTL only bounds what
// a lost notice costs: the user's sends get seqs, refused at the commit
// (holes), for up to this long. With 5 s, a sender who posts in a
// conversation every few seconds missed most of the time: in the
// realistic mix most sends waited for a lookup (BENCHMARKS.md, the row
// "cddf0c8 against" the membership cache's entries kept 30 s).
const defaultMemberTTL = 30 * time.Second

// Cache misses: statements at once, and keys per statement.
const (
	missWorkers = 2
	missBatch   = 1000
)

// forgetKeep bounds how long a forget is remembered: longer than any
// lookup or refresh statement runs (both are bounded by their context).
const forgetKeep = time.Minute

type memberKey struct{ user, conv string }

type memberEntry struct {
	exp        time.Time
	used       bool  // in memberCache.used
	mutedUntil int64 // unix ms; 0: not muted
}

const memberCacheMax = 200000

func newMemberCache(st *store.Store, ttl, timeout time.Duration, counts MemberLookups, log *slog.Logger) *memberCache {
	m := &memberCache{st: st, ttl: ttl, entries: map[memberKey]*memberEntry{}, used: map[memberKey]struct{}{}, counts: counts,
		forgot: map[memberKey]time.Time{}}
	m.misses = batch.Combiner[memberKey, store.MemberState]{Workers: missWorkers, Max: missBatch, Timeout: timeout, Log: log,
		Run: m.read}
	return m
}

// read looks keys up in PostgreSQL, in one statement.
func (m *memberCache) read(ctx context.Context, keys []memberKey) ([]store.MemberState, error) {
	convs, users := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		convs[i], users[i] = k.conv, k.user
	}
	return m.st.AreCurrentMembers(ctx, convs, users)
}

// lookup returns whether user is a current member of conv, and its mute.
func (m *memberCache) lookup(ctx context.Context, user, conv string) (store.MemberState, error) {
	key := memberKey{user, conv}
	now := time.Now()
	m.mu.Lock()
	// A cached mute is not trusted: the unmute may have committed in
	// another process a moment ago, its notice still on its way, and a
	// send written after the moderator saw update_ok must not be refused.
	// Refusals read PostgreSQL, as non-members' requests do.
	if e, ok := m.entries[key]; ok && now.Before(e.exp) && e.mutedUntil <= now.UnixMilli() {
		if !e.used {
			e.used = true
			m.used[key] = struct{}{}
		}
		muted := e.mutedUntil
		m.mu.Unlock()
		return store.MemberState{Member: true, MutedUntil: muted}, nil
	}
	m.mu.Unlock()
	if m.counts.Waited != nil {
		m.counts.Waited.Add(1)
	}
	// The statement starts after now (never one already running), so a
	// forget since now may be what it read about.
	st, err := m.misses.Do(ctx, key)
	if err != nil || !st.Member {
		return store.MemberState{}, err
	}
	m.mu.Lock()
	if m.forgotSince(key, now) { // answered; not kept
		m.mu.Unlock()
		return st, nil
	}
	if len(m.entries) >= memberCacheMax {
		// Full: drop the expired entries; only if that is not enough,
		// everything (every sender's next send then looks up again).
		for k, e := range m.entries {
			if !now.Before(e.exp) {
				delete(m.entries, k)
				delete(m.used, k)
			}
		}
		if len(m.entries) >= memberCacheMax {
			clear(m.entries)
			clear(m.used)
		}
	}
	m.entries[key] = &memberEntry{exp: now.Add(m.ttl), mutedUntil: st.MutedUntil}
	delete(m.used, key)
	m.mu.Unlock()
	return st, nil
}

// isMember reports whether user is a current member of conv.
func (m *memberCache) isMember(ctx context.Context, user, conv string) (bool, error) {
	st, err := m.lookup(ctx, user, conv)
	return st.Member, err
}

// forget drops the entry (the user left or was removed here).
func (m *memberCache) forget(user, conv string) {
	now := time.Now()
	m.mu.Lock()
	delete(m.entries, memberKey{user, conv})
	delete(m.used, memberKey{user, conv})
	m.forgot[memberKey{user, conv}] = now
	if len(m.forgot) > 1024 {
		for k, at := range m.forgot {
			if now.Sub(at) > forgetKeep {
				delete(m.forgot, k)
			}
		}
	}
	m.mu.Unlock()
}

// forgotSince reports whether key was forgotten at or after at. Call with
// m.mu held.
func (m *memberCache) forgotSince(key memberKey, at time.Time) bool {
	f, ok := m.forgot[key]
	return ok && !f.Before(at)
}

// refreshEvery is how often refreshLoop looks for entries due: five
// times per ttl, and an entry is due in its last two fifths, so a used
// entry is looked up again once or twice before it would expire.
func (m *memberCache) refreshEvery() time.Duration { return max(m.ttl/5, time.Millisecond) }

// refreshLoop refreshes the cache every refreshEvery until stop closes,
// at three quarters of its period, away from the gateway's held-ack
// flushes and fan-out's dense_seq advance with the default settings
// (package periodic).
func (m *memberCache) refreshLoop(stop <-chan struct{}) {
	periodic.Run(stop, m.refreshEvery(), 0.75, func() {
		ctx, cancel := context.WithTimeout(context.Background(), m.ttl)
		m.refresh(ctx)
		cancel()
	})
}

// refresh looks up again, in one statement, every used entry that
// expires within two refresh periods. An entry whose lookup fails is left
// to expire.
func (m *memberCache) refresh(ctx context.Context) {
	now := time.Now()
	due := now.Add(2 * m.refreshEvery())
	var keys []memberKey
	m.mu.Lock()
	for k := range m.used {
		e, ok := m.entries[k]
		switch {
		case !ok || !now.Before(e.exp): // gone or expired: the next ask looks it up
			delete(m.used, k)
			if ok {
				e.used = false
			}
		case e.exp.Before(due):
			keys = append(keys, k)
		}
	}
	m.mu.Unlock()
	for len(keys) > 0 {
		n := min(len(keys), 1000)
		m.refreshKeys(ctx, keys[:n])
		keys = keys[n:]
	}
}

func (m *memberCache) refreshKeys(ctx context.Context, keys []memberKey) {
	at := time.Now()
	member, err := m.read(ctx, keys)
	if err != nil {
		return
	}
	if m.counts.Refreshed != nil {
		m.counts.Refreshed.Add(float64(len(keys)))
	}
	m.applyRefresh(keys, member, at)
}

// applyRefresh stores what a refresh read, at at, for keys.
func (m *memberCache) applyRefresh(keys []memberKey, member []store.MemberState, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, k := range keys {
		e, ok := m.entries[k]
		switch {
		case !ok: // forgotten meanwhile: stays forgotten
		case m.forgotSince(k, at): // forgotten and looked up again meanwhile: that answer is newer
		case member[i].Member:
			e.exp, e.used, e.mutedUntil = at.Add(m.ttl), false, member[i].MutedUntil
			delete(m.used, k)
		default:
			delete(m.entries, k)
			delete(m.used, k)
		}
	}
}
