package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/wire"
)

// The store's reads checked against histories made through a whole
// server (the wire requests and the admin API make every kind of event).

// SnapshotBatch answers the snapshot requests of several users with one
// statement, reading the rows of a range of events once for everyone who
// asks for it. What each user gets must still be exactly their own
// (membership periods bound what a user sees; docs/protocol.md §4
// snapshot): here three users whose
// membership periods differ, asking for the same ranges in one batch, and
// each request's answer equals the one it gets alone.
func TestSnapshotBatchKeepsVisibilityPerUser(t *testing.T) {
	t.Parallel()
	env := parleytest.Start(t, parleytest.Config(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ana, ben, cy := env.User(t, "ana", 1)[0], env.User(t, "ben", 1)[0], env.User(t, "cy", 1)[0]
	env.User(t, "dee", 1)
	env.Group(t, "g", "ana", "ben") // seq 1: join ana, ben
	dial := func(d parleytest.Device) *client.Conn {
		c, err := client.Dial(ctx, env.Addr, d.ID, d.Token, client.DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ca, cb, cc := dial(ana), dial(ben), dial(cy)
	send := func(c *client.Conn, cmid string, want int64) {
		t.Helper()
		r, err := c.Send(ctx, "g", cmid, []byte(cmid))
		if err != nil || r.Seq != want {
			t.Fatalf("send %s: %+v, %v (want seq %d)", cmid, r, err, want)
		}
	}
	send(ca, "m2", 2)
	send(ca, "m3", 3)
	if st := env.Admin(t, "POST", "/v1/conversations/g/members", map[string]any{"users": []string{"cy"}}, nil); st != http.StatusOK {
		t.Fatalf("adding cy: %d", st) // seq 4
	}
	send(cb, "m5", 5)
	if st := env.Admin(t, "DELETE", "/v1/conversations/g/members/ben", nil, nil); st != http.StatusOK {
		t.Fatalf("removing ben: %d", st) // seq 6
	}
	send(ca, "m7", 7)
	if _, err := ca.Recall(ctx, "g", 2); err != nil { // seq 8
		t.Fatal(err)
	}
	send(cc, "m9", 9)

	st, err := store.Open(ctx, env.Cfg.PostgresURL, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Visible: ana 1-9, ben [1, 6], cy [4, 9].
	for _, tc := range []struct {
		fullMax, tail int
		qs            []store.SnapshotQuery
		want          [][]string // per request, per item: "seqs/skipped" or the error
	}{
		{200, 50, []store.SnapshotQuery{
			{User: "ana", Convs: []string{"g"}, Afters: []int64{0}},
			{User: "ben", Convs: []string{"g"}, Afters: []int64{0}},
			{User: "cy", Convs: []string{"g"}, Afters: []int64{0}},
			{User: "ana", Convs: []string{"g"}, Afters: []int64{0}}, // the same request again
			{User: "ben", Convs: []string{"g", "g"}, Afters: []int64{3, 9}},
			{User: "cy", Convs: []string{"nope", "g", "g"}, Afters: []int64{0, 3, 10}},
			{User: "dee", Convs: []string{"g"}, Afters: []int64{0}},
			{User: "ana", Convs: []string{"g\x00", "g\xff", "g"}, Afters: []int64{0, 0, -1}},
			// The extremes fail their items, not the statement (no overflow).
			{User: "ben", Convs: []string{"g", "g"}, Afters: []int64{math.MinInt64, math.MaxInt64}},
		}, [][]string{
			{"[1 2 3 4 5 6 7 8 9]/0"},
			{"[1 2 3 4 5 6]/0"},
			{"[4 5 6 7 8 9]/0"},
			{"[1 2 3 4 5 6 7 8 9]/0"},
			{"[4 5 6]/0", "[]/0"},
			{"NOT_MEMBER", "[4 5 6 7 8 9]/0", "CURSOR_AHEAD"},
			{"NOT_MEMBER"},
			{"NOT_MEMBER", "NOT_MEMBER", "CURSOR_AHEAD"},
			{"CURSOR_AHEAD", "CURSOR_AHEAD"},
		}},
		{3, 2, []store.SnapshotQuery{ // gaps over 3 get the newest 2 visible events
			{User: "ana", Convs: []string{"g", "g"}, Afters: []int64{0, 6}},
			{User: "ben", Convs: []string{"g", "g"}, Afters: []int64{0, 6}},
			{User: "cy", Convs: []string{"g", "g"}, Afters: []int64{0, 6}},
		}, [][]string{
			{"[8 9]/7", "[7 8 9]/0"},
			{"[5 6]/4", "[]/0"},
			{"[8 9]/4", "[7 8 9]/0"},
		}},
	} {
		batch, err := st.SnapshotBatch(ctx, tc.qs, tc.fullMax, tc.tail)
		if err != nil {
			t.Fatal(err)
		}
		for i, q := range tc.qs {
			alone, err := st.Snapshot(ctx, q.User, q.Convs, q.Afters, tc.fullMax, tc.tail)
			if err != nil {
				t.Fatal(err)
			}
			if len(batch[i]) != len(q.Convs) {
				t.Fatalf("request %d: %d items for %d convs", i, len(batch[i]), len(q.Convs))
			}
			for j, it := range batch[i] {
				got := fmt.Sprintf("%v/%d", seqs(it.Events), it.Skipped)
				switch {
				case errors.Is(it.Err, store.ErrNotMember):
					got = "NOT_MEMBER"
				case errors.Is(it.Err, store.ErrCursorAhead):
					got = "CURSOR_AHEAD"
				case it.Err != nil:
					got = it.Err.Error()
				}
				if got != tc.want[i][j] {
					t.Errorf("fullMax %d: %s's item %d (%s after %d) = %s, want %s", tc.fullMax, q.User, j, q.Convs[j], q.Afters[j], got, tc.want[i][j])
				}
				if it.Conv != q.Convs[j] {
					t.Errorf("item %d of %s names %q, want %q", j, q.User, it.Conv, q.Convs[j])
				}
				if fmt.Sprintf("%+v", it) != fmt.Sprintf("%+v", alone[j]) {
					t.Errorf("%s's item %d differs in a batch:\n batch %+v\n alone %+v", q.User, j, it, alone[j])
				}
				for _, e := range it.Events {
					if e.Seq == 2 && (!e.Recalled || e.Body != nil) || e.Seq != 2 && e.Kind == store.KindMsg && string(e.Body) != fmt.Sprint("m", e.Seq) {
						t.Errorf("%s's event %d: recalled %v body %q", q.User, e.Seq, e.Recalled, e.Body)
					}
				}
				if it.Err == nil && (it.Head != 9 || it.Unread < 0) {
					t.Errorf("%s's item %d: head %d unread %d", q.User, j, it.Head, it.Unread)
				}
			}
		}
	}
}

func seqs(evs []store.Event) []int64 {
	out := []int64{}
	for _, e := range evs {
		out = append(out, e.Seq)
	}
	return slices.Clip(out)
}

// Every read of events gives an event the same fields: a sync page
// (ReadPage) and both forms of a snapshot (every event after `after`, and
// the newest few) return equal Events for every kind of event, a message's
// mentions, edits and recall included.
func TestEventReadsAgree(t *testing.T) {
	t.Parallel()
	env := parleytest.Start(t, parleytest.Config(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	devs := map[string]*client.Conn{}
	for _, u := range []string{"ana", "ben", "cy"} {
		d := env.User(t, u, 1)[0]
		c, err := client.Dial(ctx, env.Addr, d.ID, d.Token, client.DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		devs[u] = c
	}
	do := func(who string, q wire.Request) wire.Message {
		t.Helper()
		m, err := devs[who].Do(ctx, q)
		if err != nil {
			t.Fatalf("%s %s: %v", who, q.T, err)
		}
		return m
	}
	do("ana", wire.Request{T: wire.TConvCreate, Kind: wire.ConvGroup, Conv: "g", Members: []string{"ben", "cy"}})
	m := do("ana", wire.Request{T: wire.TSend, Conv: "g", Cmid: "m1", Body: []byte("hi @ben @cy"), Mentions: []string{"ben", "cy"}})
	do("ben", wire.Request{T: wire.TSend, Conv: "g", Cmid: "m2", Body: []byte("plain")})
	do("ana", wire.Request{T: wire.TEdit, Conv: "g", Seq: m.Seq, Body: []byte("hi all")})
	r := do("ben", wire.Request{T: wire.TSend, Conv: "g", Cmid: "m3", Body: []byte("oops @ana"), Mentions: []string{"ana"}})
	do("ben", wire.Request{T: wire.TRecall, Conv: "g", Seq: r.Seq})
	do("ana", wire.Request{T: wire.TRole, Conv: "g", User: "ben", Role: wire.RoleAdmin})
	do("ben", wire.Request{T: wire.TMemberMute, Conv: "g", User: "cy", MutedUntil: time.Now().Add(time.Hour).UnixMilli()})
	do("ana", wire.Request{T: wire.TConvUpdate, Conv: "g", Title: "T", Invite: wire.InviteAdmins})
	do("ben", wire.Request{T: wire.TBan, Conv: "g", User: "cy"})
	do("ana", wire.Request{T: wire.TUnban, Conv: "g", User: "cy"})
	do("ana", wire.Request{T: wire.TMembersAdd, Conv: "g", Users: []string{"cy"}})

	st, err := store.Open(ctx, env.Cfg.PostgresURL, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	page, err := st.ReadPage(ctx, "g", "ana", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	n := int(page.Head)
	if len(page.Events) != n || n < 10 {
		t.Fatalf("sync page: %d events, head %d", len(page.Events), page.Head)
	}
	if e := page.Events[m.Seq-1]; !slices.Equal(e.Mentions, []string{"ben", "cy"}) || e.Edited == 0 || string(e.Body) != "hi all" {
		t.Errorf("sync page: the edited message %+v", e)
	}
	if e := page.Events[r.Seq-1]; !slices.Equal(e.Mentions, []string{"ana"}) || !e.Recalled || len(e.Body) != 0 {
		t.Errorf("sync page: the recalled message %+v", e)
	}
	full, err := st.Snapshot(ctx, "ana", []string{"g"}, []int64{0}, n, n)
	if err != nil {
		t.Fatal(err)
	}
	tail, err := st.Snapshot(ctx, "ana", []string{"g"}, []int64{0}, n-1, n-1) // the newest n-1
	if err != nil {
		t.Fatal(err)
	}
	for what, evs := range map[string][]store.Event{"snapshot (full)": full[0].Events, "snapshot (tail)": tail[0].Events} {
		want := page.Events[n-len(evs):]
		if len(evs) < n-1 {
			t.Errorf("%s: %d events, want %d", what, len(evs), len(want))
		}
		for i := range evs {
			if !reflect.DeepEqual(evs[i], want[i]) {
				t.Errorf("%s: event %d:\n got %+v\nwant %+v (sync)", what, want[i].Seq, evs[i], want[i])
			}
		}
	}
}
