package eventlog

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/test/testenv"
)

// A refresh that read a member's state before it changed (here: an
// unmute) must not store it once the change was heard (forget) and a
// newer lookup cached the new state; nor may a lookup that began before
// the forget keep its answer.
func TestMemberCacheForgetBeatsOlderReads(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := testenv.PostgresURL(t)
	st, err := store.Open(ctx, url, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateUsers(ctx, []string{"own", "mem"}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateConversation(ctx, store.MembershipChange{Conv: "g", Seq: 1, Ts: 1}, "group", "", []string{"own", "mem"}); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	setMute := func(until int64) {
		t.Helper()
		if _, err := conn.Exec(ctx, `UPDATE membership_periods SET muted_until = $1 WHERE conv_id = 'g' AND user_id = 'mem'`, until); err != nil {
			t.Fatal(err)
		}
	}
	muted := time.Now().Add(time.Hour).UnixMilli()
	setMute(muted)
	m := newMemberCache(st, time.Minute, 10*time.Second, MemberLookups{}, nil)
	key := memberKey{"mem", "g"}
	if s, err := m.lookup(ctx, "mem", "g"); err != nil || s.MutedUntil != muted {
		t.Fatalf("lookup %+v %v", s, err)
	}

	// A refresh reads (muted); the unmute commits and is heard; a send
	// looks up again (not muted); then the refresh's answer arrives.
	at := time.Now()
	stale, err := st.AreCurrentMembers(ctx, []string{"g"}, []string{"mem"})
	if err != nil || stale[0].MutedUntil != muted {
		t.Fatalf("stale read %+v %v", stale, err)
	}
	setMute(0)
	m.forget("mem", "g")
	if s, err := m.lookup(ctx, "mem", "g"); err != nil || s.MutedUntil != 0 {
		t.Fatalf("lookup after the unmute %+v %v", s, err)
	}
	m.applyRefresh([]memberKey{key}, stale, at)
	if s, err := m.lookup(ctx, "mem", "g"); err != nil || s.MutedUntil != 0 {
		t.Fatalf("the refresh read before the unmute put the mute back: %+v %v", s, err)
	}

	// A refresh read after the forget is stored as usual.
	setMute(muted)
	fresh, err := st.AreCurrentMembers(ctx, []string{"g"}, []string{"mem"})
	if err != nil {
		t.Fatal(err)
	}
	m.applyRefresh([]memberKey{key}, fresh, time.Now())
	m.mu.Lock()
	e := m.entries[key]
	m.mu.Unlock()
	if e == nil || e.mutedUntil != muted {
		t.Fatalf("a refresh read after the forget was not stored: %+v", e)
	}
}
