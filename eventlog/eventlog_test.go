package eventlog_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/scripts"
	"github.com/parley-im/parley/seq"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/test/parleytest"
)

// TestSendFansOutBeforeAnswering: a committed send is handed to fan-out
// before its sender is answered. A client that sends its next message on
// send_ok would otherwise race its own messages through fan-out, and
// members could be pushed them out of order.
func TestSendFansOutBeforeAnswering(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	fanned := map[int64]bool{}
	_, newLog := logs(ctx, t, "ana")
	l := newLog(eventlog.Config{CommitBatch: 16, CommitWorkers: 4}, func(evs []eventlog.Committed) {
		mu.Lock()
		for _, e := range evs {
			fanned[e.Seq] = true
		}
		mu.Unlock()
	})
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		l.Send(ctx, eventlog.Message{Conv: "g", Sender: "ana", Cmid: fmt.Sprint(i), Body: []byte("m")}, func(r eventlog.SendResult) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case r.Err != nil:
				errs <- r.Err
			case !fanned[r.Seq]:
				errs <- fmt.Errorf("seq %d answered before it was handed to fan-out", r.Seq)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// logs sets up a migrated database and a Redis key prefix of the test's
// own (no server runs) with users members of group "g", and returns a
// store and a constructor of event logs over them (each one as another
// process's would be), closed when the test ends.
func logs(ctx context.Context, t *testing.T, members ...string) (*store.Store, func(eventlog.Config, func([]eventlog.Committed)) *eventlog.Log) {
	cfg := parleytest.Config(t)
	st, err := store.Open(ctx, cfg.PostgresURL, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.CreateUsers(ctx, members); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateConversation(ctx, store.MembershipChange{Conv: "g", Seq: 1, Ts: time.Now().UnixMilli()}, "group", "", members); err != nil {
		t.Fatal(err)
	}
	rdb := parleytest.RedisClient(t, cfg)
	if err := scripts.Load(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	prefix := cfg.RedisPrefix
	return st, func(cfg eventlog.Config, onCommit func([]eventlog.Committed)) *eventlog.Log {
		cfg.HoleTimeout, cfg.CommitLinger = time.Second, time.Millisecond
		l := eventlog.New(st, seq.New(rdb, prefix, st.Heads), cfg, slog.New(slog.DiscardHandler), onCommit)
		t.Cleanup(l.Close)
		return l
	}
}

// send sends one message and waits for its result.
func send(ctx context.Context, l *eventlog.Log, user, cmid string) eventlog.SendResult {
	res := make(chan eventlog.SendResult, 1)
	l.Send(ctx, eventlog.Message{Conv: "g", Sender: user, Cmid: cmid, Body: []byte("m")}, func(r eventlog.SendResult) { res <- r })
	return <-res
}

// TestMemberCacheRefreshedInBackground: the membership check before a
// send's seq is allocated is cached for MemberTTL, and a sender who keeps
// sending never waits for it again: used entries are looked up again in
// the background before they expire. Answers stay at most MemberTTL old:
// a member removed by another process is refused before a seq is
// allocated once that long has passed, and an entry nobody used expires.
func TestMemberCacheRefreshedInBackground(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A TTL of 1.5 s: the background refresh runs every fifth of it, and
	// must not be held up past the entry's expiry by a stalled host (the
	// test runs beside the race-enabled server tests on two cores; with
	// 600 ms a stall once made a send wait for a second lookup).
	const ttl = 1500 * time.Millisecond
	st, newLog := logs(ctx, t, "ana", "bob")
	var waitedC, refreshedC counter
	cfg := eventlog.Config{CommitBatch: 16, CommitWorkers: 2, MemberTTL: ttl}
	other := newLog(cfg, nil)
	cfg.MemberLookups = eventlog.MemberLookups{Waited: &waitedC, Refreshed: &refreshedC}
	l := newLog(cfg, nil)
	lookups := func() (waited, refreshed int64) { return waitedC.n.Load(), refreshedC.n.Load() }

	// ana sends every 20 ms for four TTLs: only her first send waits.
	for i := range int(4 * ttl / (20 * time.Millisecond)) {
		if r := send(ctx, l, "ana", fmt.Sprint("a", i)); r.Err != nil {
			t.Fatal(r.Err)
		}
		time.Sleep(20 * time.Millisecond) // pacing, on purpose: a send every 20 ms
	}
	if waited, refreshed := lookups(); waited != 1 || refreshed < 2 {
		t.Fatalf("ana's sends waited for %d membership lookups (want 1), %d were made in the background (want >= 2)", waited, refreshed)
	}

	// bob, removed by the other process, keeps sending: his commits fail
	// (the commit checks membership itself) and, within a TTL, so does
	// the check before allocation, which then allocates nothing.
	if r := send(ctx, l, "bob", "b0"); r.Err != nil {
		t.Fatal(r.Err)
	}
	if _, err := other.RemoveMember(ctx, "g", "", "", "bob"); err != nil {
		t.Fatal(err)
	}
	for end, i := time.Now().Add(ttl+100*time.Millisecond), 1; time.Now().Before(end); i++ {
		send(ctx, l, "bob", fmt.Sprint("b", i))
		time.Sleep(20 * time.Millisecond) // pacing, on purpose: a send every 20 ms for a TTL
	}
	head, err := st.Head(ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	if r := send(ctx, l, "bob", "b-last"); !errors.Is(r.Err, store.ErrNotMember) {
		t.Fatalf("bob's send more than a TTL after his removal: %+v, want NOT_MEMBER", r)
	}
	if after, err := st.Head(ctx, "g"); err != nil || after != head {
		t.Fatalf("refused send moved head %d -> %d (%v)", head, after, err)
	}

	// ana's entry, unused for two TTLs, expired: her next send waits.
	time.Sleep(2 * ttl) // on purpose: two TTLs without a send
	waited, _ := lookups()
	if r := send(ctx, l, "ana", "a-last"); r.Err != nil {
		t.Fatal(r.Err)
	}
	if now, _ := lookups(); now != waited+1 {
		t.Fatalf("ana's send after two idle TTLs waited for %d lookups, want 1", now-waited)
	}
}

// counter counts what an eventlog.MemberLookups field is given.
type counter struct{ n atomic.Int64 }

func (c *counter) Add(v float64) { c.n.Add(int64(v)) }

// TestRejectedChangesAllocateNothing: a membership change or recall is
// checked under the conversation's change lock before its seq is
// allocated, whatever the membership cache says. bob is removed by
// another process, which this log's cache never hears of; his changes
// and recalls through this log are refused and head does not move.
func TestRejectedChangesAllocateNothing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, newLog := logs(ctx, t, "ana", "bob", "cy")
	cfg := eventlog.Config{CommitBatch: 16, CommitWorkers: 2, MemberTTL: time.Hour}
	other, l := newLog(cfg, nil), newLog(cfg, nil)
	r := send(ctx, l, "bob", "b0") // l caches bob as a member
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if _, err := other.RemoveMember(ctx, "g", "", "", "bob"); err != nil {
		t.Fatal(err)
	}
	if ok, err := l.IsMember(ctx, "bob", "g"); err != nil || !ok {
		t.Fatalf("l's cache: bob member %v (%v); the test needs a stale entry", ok, err)
	}
	head, err := st.Head(ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	for what, try := range map[string]func() error{
		"members_add by bob": func() error { _, err := l.AddMembers(ctx, "g", "bob", "", []string{"cy"}); return err },
		"leave by bob":       func() error { _, err := l.RemoveMember(ctx, "g", "bob", "", "bob"); return err },
		"recall by bob":      func() error { _, err := l.Recall(ctx, "g", "bob", "", r.Seq, time.Hour); return err },
		"removing bob again": func() error { _, err := l.RemoveMember(ctx, "g", "", "", "bob"); return err },
	} {
		if err := try(); !errors.Is(err, store.ErrNotMember) {
			t.Fatalf("%s: %v, want ErrNotMember", what, err)
		}
		if now, err := st.Head(ctx, "g"); err != nil || now != head {
			t.Fatalf("%s moved head %d -> %d (%v)", what, head, now, err)
		}
	}
	// An unknown user is refused before allocation too, and so is adding
	// current members only (nothing to append).
	if _, err := l.AddMembers(ctx, "g", "ana", "", []string{"cy", "no-such-user"}); !errors.Is(err, store.ErrUnknownUser) {
		t.Fatalf("adding an unknown user: %v", err)
	}
	if h, err := l.AddMembers(ctx, "g", "ana", "", []string{"cy"}); err != nil || h != head {
		t.Fatalf("adding a current member: head %d (%v), want %d unchanged", h, err, head)
	}
	if now, err := st.Head(ctx, "g"); err != nil || now != head {
		t.Fatalf("refused membership changes moved head %d -> %d (%v)", head, now, err)
	}
}
