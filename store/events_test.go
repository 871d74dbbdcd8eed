package store_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/test/parleytest"
)

// storeFix is a migrated database and a Redis key prefix of the test's
// own (no server runs) with users ana, ben and cy, a device each.
type storeFix struct {
	cfg config.Config // PostgresURL, RedisURL, RedisPrefix
	url string
	st  *store.Store
	ctx context.Context
}

// startStore sets up a storeFix and opens a store of its database; ctx
// ends with the test.
func startStore(t *testing.T) (*storeFix, *store.Store, context.Context) {
	t.Helper()
	f := newStoreFix(t, 2, 30*time.Second)
	return f, f.st, f.ctx
}

// newStoreFix is startStore for tests and benchmarks: a store with conns
// connections, and a context that ends after timeout or with the test.
func newStoreFix(t testing.TB, conns int, timeout time.Duration) *storeFix {
	t.Helper()
	cfg := parleytest.Config(t) // a copy of a migrated database, and nothing started
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	st, err := store.Open(ctx, cfg.PostgresURL, conns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	f := &storeFix{cfg: cfg, url: cfg.PostgresURL, st: st, ctx: ctx}
	for _, u := range []string{"ana", "ben", "cy"} {
		f.User(t, u)
	}
	return f
}

// Group creates group id with members (seq 1, their joins), as the admin
// API does, and returns its head (1).
func (f *storeFix) Group(t testing.TB, id string, members ...string) int64 {
	t.Helper()
	if err := f.st.CreateConversation(f.ctx, store.MembershipChange{Conv: id, Seq: 1, Ts: time.Now().UnixMilli()}, "group", "", members); err != nil {
		t.Fatalf("creating group %s: %v", id, err)
	}
	return 1
}

// User creates user id with a device, id+"-d1", and returns the device.
func (f *storeFix) User(t testing.TB, id string) store.Device {
	t.Helper()
	token := sha256.Sum256([]byte(id + "-token"))
	dev := store.Device{ID: id + "-d1", User: id, TokenSHA256: token[:], InstallEpoch: 1}
	if err := f.st.CreateUsers(f.ctx, []string{id}); err != nil {
		t.Fatal(err)
	}
	if err := f.st.CreateDevices(f.ctx, []store.Device{dev}); err != nil {
		t.Fatal(err)
	}
	return dev
}

// Remove removes user from conv at the next seq, as the admin API does.
func (f *storeFix) Remove(t *testing.T, conv, user string) {
	t.Helper()
	var head int64
	if err := pgConn(t, f.ctx, f).QueryRow(f.ctx, `SELECT coalesce(max(e.seq), 0) FROM events e JOIN conversations c ON c.conv_key = e.conv_key WHERE c.conv_id = $1`, conv).Scan(&head); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.st.RemoveMember(f.ctx, &store.MembershipChange{Conv: conv, Seq: head + 1, Ts: time.Now().UnixMilli()}, user); err != nil {
		t.Fatalf("removing %s from %s: %v", user, conv, err)
	}
}

// pgConn opens a plain connection to f's database, for a test to set up
// or inspect rows directly; it is closed when the test ends.
func pgConn(t *testing.T, ctx context.Context, f *storeFix) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// InsertMessages tries a plain INSERT first and, when any row conflicts
// with a stored one, runs the batch again tolerating conflicts. Either way
// every row gets its own answer: here one batch holds new rows, a resend
// of a stored cmid, the same cmid twice, a seq already taken and a sender
// who is not a member. The failed first try costs no connection.
func TestInsertMessagesConflictsInOneBatch(t *testing.T) {
	t.Parallel()
	env, st, ctx := startStore(t)
	env.Group(t, "g", "ana", "ben") // seq 1
	msg := func(sender, cmid string, seq int64) store.NewMessage {
		return store.NewMessage{Conv: "g", Sender: sender, Cmid: cmid, Body: []byte(cmid), Seq: seq, Ts: 1000 + seq}
	}
	// A clean batch takes the plain path.
	res, err := st.InsertMessages(ctx, []store.NewMessage{msg("ana", "a", 2), msg("ben", "b", 3)}, 100)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.Dup || r.Seq != int64(2+i) || !r.HaveRecipients || len(r.Recipients) != 2 || r.Members != 2 {
			t.Fatalf("clean batch, row %d: %+v", i, r)
		}
	}
	// The plain insert of the next batch fails by design; its connection
	// goes back to the pool rolled back, not closed and replaced.
	conns := st.Stat().NewConnsCount()
	res, err = st.InsertMessages(ctx, []store.NewMessage{
		msg("ana", "c", 4),  // new
		msg("ana", "a", 5),  // resend of seq 2
		msg("ben", "d", 6),  // new
		msg("ben", "d", 7),  // the same cmid again in this batch
		msg("ana", "e", 3),  // seq 3 is taken
		msg("cy", "f", 8),   // not a member
		msg("ben", "g2", 9), // new
	}, 100)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		seq int64
		dup bool
		err error
	}{{4, false, nil}, {2, true, nil}, {6, false, nil}, {6, true, nil}, {3, false, store.ErrSeqTaken}, {8, false, store.ErrNotMember}, {9, false, nil}}
	for i, w := range want {
		r := res[i]
		if r.Seq != w.seq || r.Dup != w.dup || !errors.Is(r.Err, w.err) {
			t.Errorf("row %d: %+v; want seq %d dup %v err %v", i, r, w.seq, w.dup, w.err)
		}
	}
	if n := st.Stat().NewConnsCount(); n != conns {
		t.Errorf("the conflicting batch opened %d new connections", n-conns)
	}
}

// The idempotency index holds a 64-bit hash of (sender, cmid), not the
// two. Different (sender, cmid) with the same hash are still different
// messages, each stored once, and a resend of any of them is still
// answered with its original seq. With every hash made equal, each
// message after a conversation's first collides.
func TestInsertMessagesCmidHashCollisions(t *testing.T) {
	t.Parallel()
	env, st, ctx := startStore(t)
	env.Group(t, "g", "ana", "ben") // seq 1
	conn := pgConn(t, ctx, env)
	if _, err := conn.Exec(ctx, `CREATE OR REPLACE FUNCTION parley_cmid_hash(p_sender text, p_cmid text) RETURNS bigint
		LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 7::bigint $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `REINDEX INDEX events_by_cmid_hash`); err != nil {
		t.Fatal(err)
	}
	msg := func(sender, cmid string, seq int64) store.NewMessage {
		return store.NewMessage{Conv: "g", Sender: sender, Cmid: cmid, Body: []byte(cmid), Seq: seq, Ts: 1000 + seq}
	}
	type want struct {
		seq int64
		dup bool
	}
	check := func(batch string, res []store.InsertResult, err error, wants []want) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", batch, err)
		}
		for i, w := range wants {
			if r := res[i]; r.Err != nil || r.Seq != w.seq || r.Dup != w.dup {
				t.Errorf("%s, row %d: %+v; want seq %d dup %v", batch, i, r, w.seq, w.dup)
			}
		}
	}
	res, err := st.InsertMessages(ctx, []store.NewMessage{msg("ana", "a", 2), msg("ben", "b", 3), msg("ana", "c", 4)}, 100)
	check("new", res, err, []want{{2, false}, {3, false}, {4, false}})
	if !res[1].HaveRecipients || len(res[1].Recipients) != 2 || res[1].Members != 2 {
		t.Errorf("a collided row's recipients: %+v", res[1])
	}
	res, err = st.InsertMessages(ctx, []store.NewMessage{
		msg("ana", "a", 5),  // resend of the hashed row
		msg("ben", "b", 6),  // resend of a collided row
		msg("ben", "e", 7),  // new, collides
		msg("ana", "c", 8),  // resend of a collided row
		msg("ben", "e", 9),  // the new one again, in the same batch
		msg("ben", "a", 10), // ana's cmid, another sender: new
	}, 100)
	check("resends", res, err, []want{{2, true}, {3, true}, {7, false}, {4, true}, {7, true}, {10, false}})

	var msgs, collided, holes int
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE e.kind = 1), count(*) FILTER (WHERE e.cmid_collided), count(*) FILTER (WHERE e.kind = 0)
		FROM events e JOIN conversations c USING (conv_key) WHERE c.conv_id = 'g'`).Scan(&msgs, &collided, &holes); err != nil {
		t.Fatal(err)
	}
	if msgs != 5 || collided != 4 || holes != 4 {
		t.Errorf("stored %d messages (%d collided) and %d holes; want 5 (4) and 4", msgs, collided, holes)
	}
}

// CurrentMembersOf returns each conversation's current members in one
// statement: not those who left, nothing for a conversation without any
// or that does not exist.
func TestCurrentMembersOf(t *testing.T) {
	t.Parallel()
	env, st, ctx := startStore(t)
	env.Group(t, "g", "ana", "ben", "cy")
	env.Group(t, "h", "ana", "ben")
	env.Remove(t, "g", "ben")
	got, err := st.CurrentMembersOf(ctx, []string{"g", "h", "nope"})
	if err != nil {
		t.Fatal(err)
	}
	for _, us := range got {
		slices.Sort(us)
	}
	if len(got) != 2 || !slices.Equal(got["g"], []string{"ana", "cy"}) || !slices.Equal(got["h"], []string{"ana", "ben"}) {
		t.Fatalf("current members: %v", got)
	}
}

// BigMembershipsOf returns each user's current periods in conversations
// of at least the given size, for many users in one statement.
func TestBigMembershipsOf(t *testing.T) {
	t.Parallel()
	env, st, ctx := startStore(t)
	env.Group(t, "big", "ana", "ben", "cy")
	env.Group(t, "big2", "ana", "ben", "cy")
	env.Group(t, "small", "ana", "ben")
	env.Remove(t, "big2", "ben")
	got, err := st.BigMembershipsOf(ctx, []string{"ana", "ben", "cy", "nobody"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	convs := func(user string) []string {
		var cs []string
		for _, p := range got[user] {
			if p.User != user || p.FromSeq != 1 {
				t.Errorf("period %+v of %s", p, user)
			}
			cs = append(cs, p.Conv)
		}
		slices.Sort(cs)
		return cs
	}
	// big2 has 2 members after ben left: not big any more.
	if len(got) != 3 || !slices.Equal(convs("ana"), []string{"big"}) || !slices.Equal(convs("ben"), []string{"big"}) || !slices.Equal(convs("cy"), []string{"big"}) {
		t.Fatalf("big memberships: %v", got)
	}
}

// Heads reads many conversations' heads in one statement; a conversation
// that does not exist gets ErrNotFound in its place.
func TestHeads(t *testing.T) {
	t.Parallel()
	env, st, ctx := startStore(t)
	env.Group(t, "g", "ana", "ben") // seq 1
	env.Group(t, "h", "ana", "cy")
	if _, err := st.InsertMessages(ctx, []store.NewMessage{{Conv: "h", Sender: "ana", Cmid: "x", Body: []byte("x"), Seq: 2, Ts: 1}}, 0); err != nil {
		t.Fatal(err)
	}
	heads, errs, err := st.Heads(ctx, []string{"h", "nope", "g"})
	if err != nil {
		t.Fatal(err)
	}
	if heads[0] != 2 || heads[2] != 1 || errs == nil || errs[0] != nil || !errors.Is(errs[1], store.ErrNotFound) || errs[2] != nil {
		t.Fatalf("Heads(h, nope, g) = %v, %v; want [2 _ 1], ErrNotFound for nope only", heads, errs)
	}
	if _, errs, err := st.Heads(ctx, []string{"g"}); err != nil || errs != nil {
		t.Fatalf("Heads(g): errs %v, err %v; want none", errs, err)
	}
}

// A read merge and a clear say whether the reader hides its read
// positions (receipts_private), as of their own transaction, so a read
// receipt needs nothing more from PostgreSQL.
func TestReadMergeCarriesReceiptsPrivate(t *testing.T) {
	t.Parallel()
	env, st, ctx := startStore(t)
	env.Group(t, "g", "ana", "ben") // seq 1
	if _, err := st.SetReceiptsPrivate(ctx, "ben", true); err != nil {
		t.Fatal(err)
	}
	rs, err := st.MarkReads(ctx, []store.ReadUpdate{{User: "ana", Conv: "g", Seq: 1}, {User: "ben", Conv: "g", Seq: 1}})
	if err != nil || rs[0].Err != nil || rs[1].Err != nil {
		t.Fatalf("MarkReads: %+v %v", rs, err)
	}
	if !rs[0].Advanced || rs[0].ReceiptsPrivate || !rs[1].Advanced || !rs[1].ReceiptsPrivate {
		t.Fatalf("reads %+v: want both advanced, ben's private only", rs)
	}
	if _, err := st.SetReceiptsPrivate(ctx, "ben", false); err != nil {
		t.Fatal(err)
	}
	env.Group(t, "h", "ana", "ben") // seq 1, read by nobody yet
	c, err := st.Clear(ctx, "ben", "h", 1)
	if err != nil || !c.ReadAdvanced || c.ReceiptsPrivate {
		t.Fatalf("clear by ben, public again: %+v %v", c, err)
	}
	if _, err := st.SetReceiptsPrivate(ctx, "ana", true); err != nil {
		t.Fatal(err)
	}
	c, err = st.Clear(ctx, "ana", "h", 1)
	if err != nil || !c.ReadAdvanced || !c.ReceiptsPrivate {
		t.Fatalf("clear by ana, private: %+v %v", c, err)
	}
}

// StoredSends finds the messages stored under idempotency keys, through
// the hash index and, for rows whose hash another (sender, cmid) holds,
// the collided rows' index; keys never stored (another sender's cmid, a
// conversation that does not exist, ids PostgreSQL cannot hold) find
// nothing and fail nothing.
func TestStoredSends(t *testing.T) {
	t.Parallel()
	env, st, ctx := startStore(t)
	env.Group(t, "g", "ana", "ben") // seq 1
	conn := pgConn(t, ctx, env)
	msg := func(sender, cmid string, seq int64) store.NewMessage {
		return store.NewMessage{Conv: "g", Sender: sender, Cmid: cmid, Body: []byte(cmid), Seq: seq, Ts: 1000 + seq}
	}
	if _, err := st.InsertMessages(ctx, []store.NewMessage{msg("ana", "a", 2)}, 100); err != nil {
		t.Fatal(err)
	}
	// Every hash equal from here on: b and c are stored as collided rows.
	if _, err := conn.Exec(ctx, `CREATE OR REPLACE FUNCTION parley_cmid_hash(p_sender text, p_cmid text) RETURNS bigint
		LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 7::bigint $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `REINDEX INDEX events_by_cmid_hash`); err != nil {
		t.Fatal(err)
	}
	res, err := st.InsertMessages(ctx, []store.NewMessage{msg("ben", "b", 3), msg("ana", "c", 4)}, 100)
	if err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("inserting collided rows: %+v %v", res, err)
	}
	keys := []store.SendKey{
		{"g", "ana", "a"},      // the hashed row
		{"g", "ben", "b"},      // a collided row
		{"g", "ben", "a"},      // ana's cmid, another sender
		{"g", "ana", "c"},      // a collided row
		{"g", "ana", "new"},    // never stored
		{"nope", "ana", "a"},   // no such conversation
		{"g", "ana", "x\x00y"}, // not a text value PostgreSQL can hold
		{"g", "ana", "\xff"},   // nor this
	}
	got, err := st.StoredSends(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.Sent{{2, 1002}, {3, 1003}, {}, {4, 1004}, {}, {}, {}, {}}
	if !slices.Equal(got, want) {
		t.Fatalf("stored sends %v, want %v", got, want)
	}
	if got, err := st.StoredSends(ctx, nil); err != nil || len(got) != 0 {
		t.Fatalf("no keys: %v %v", got, err)
	}
}
