package eventlog_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/store"
)

// TestModeration walks a group through its owner's and admins' powers at
// the log's level: roles, mutes, removals, bans, settings and recalls of
// others' messages. Every refusal leaves the head where it was.
func TestModeration(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, newLog := logs(ctx, t, "own", "adm", "mem", "x")
	var events []eventlog.Committed
	l := newLog(eventlog.Config{CommitBatch: 16, CommitWorkers: 2}, func(evs []eventlog.Committed) { events = append(events, evs...) })
	head := func() int64 {
		t.Helper()
		h, err := st.Head(ctx, "g")
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	refused := func(what string, want error, do func() error) {
		t.Helper()
		before := head()
		if err := do(); !errors.Is(err, want) {
			t.Fatalf("%s: %v, want %v", what, err, want)
		}
		if h := head(); h != before {
			t.Fatalf("%s moved the head %d -> %d", what, before, h)
		}
	}
	must := func(r store.UpdateResult, err error) store.UpdateResult {
		t.Helper()
		if err != nil || r.Seq == 0 {
			t.Fatalf("%+v %v", r, err)
		}
		return r
	}

	// A group made by the admin API has no owner: the operator sets one.
	must(l.SetRole(ctx, "g", "", "", "own", store.RoleOwner))
	refused("a member gives a role", store.ErrForbidden, func() error { _, err := l.SetRole(ctx, "g", "adm", "", "mem", store.RoleAdmin); return err })
	r := must(l.SetRole(ctx, "g", "own", "", "adm", store.RoleAdmin))
	if e := events[len(events)-1]; e.Kind != store.KindUpdate || e.Seq != r.Seq || e.Update.Role != "admin" || len(e.Users) != 1 || e.Users[0] != "adm" || e.Sender != "own" {
		t.Fatalf("update event %+v", e)
	}
	if again, err := l.SetRole(ctx, "g", "own", "", "adm", store.RoleAdmin); err != nil || again.Seq != head() {
		t.Fatalf("the same role again: %+v %v (head %d)", again, err, head())
	}
	refused("the owner demotes itself", store.ErrForbidden, func() error { _, err := l.SetRole(ctx, "g", "own", "", "own", store.RoleMember); return err })

	// Mutes: the admin mutes a plain member, not the owner.
	refused("an admin mutes the owner", store.ErrForbidden, func() error {
		_, err := l.MuteMember(ctx, "g", "adm", "", "own", time.Now().Add(time.Hour).UnixMilli())
		return err
	})
	refused("a member mutes", store.ErrForbidden, func() error {
		_, err := l.MuteMember(ctx, "g", "mem", "", "x", time.Now().Add(time.Hour).UnixMilli())
		return err
	})
	until := time.Now().Add(time.Hour).UnixMilli()
	must(l.MuteMember(ctx, "g", "adm", "", "mem", until))
	if res := send(ctx, l, "mem", "m1"); !errors.Is(res.Err, store.ErrForbidden) {
		t.Fatalf("a muted member's send: %+v", res)
	}
	must(l.MuteMember(ctx, "g", "adm", "", "mem", 0))
	if res := send(ctx, l, "mem", "m2"); res.Err != nil {
		t.Fatalf("an unmuted member's send: %+v", res)
	}

	// Removals: an admin removes plain members only, all or nothing.
	refused("an admin removes the owner", store.ErrForbidden, func() error { _, _, err := l.RemoveMembers(ctx, "g", "adm", "", []string{"mem", "own"}); return err })
	h, removed, err := l.RemoveMembers(ctx, "g", "adm", "", []string{"mem", "nobody"})
	if err != nil || len(removed) != 1 || removed[0] != "mem" || h != head() {
		t.Fatalf("remove mem: %d %v %v", h, removed, err)
	}
	if res := send(ctx, l, "mem", "m3"); !errors.Is(res.Err, store.ErrNotMember) {
		t.Fatalf("a removed member's send: %+v", res)
	}

	// Bans: the owner bans x (a member: removed too); nobody may add x
	// back until it is unbanned.
	b := must(l.Ban(ctx, "g", "own", "", "x"))
	if b.LeaveSeq != b.Seq+1 {
		t.Fatalf("ban %+v: want the leave right after the update", b)
	}
	refused("adding a banned user", store.ErrForbidden, func() error { _, err := l.AddMembers(ctx, "g", "own", "", []string{"x"}); return err })
	must(l.Unban(ctx, "g", "own", "", "x"))
	if ok, _ := l.IsMember(ctx, "x", "g"); ok {
		t.Fatal("unban added x back")
	}

	// Settings: with invite "admins" a plain member cannot add.
	if _, err := l.AddMembers(ctx, "g", "own", "", []string{"mem"}); err != nil {
		t.Fatal(err)
	}
	title := "moderated"
	must(l.UpdateConv(ctx, "g", "adm", "", &title, store.InviteAdmins))
	refused("a plain member adds under invite admins", store.ErrForbidden, func() error { _, err := l.AddMembers(ctx, "g", "mem", "", []string{"x"}); return err })
	if _, err := l.AddMembers(ctx, "g", "adm", "", []string{"x"}); err != nil {
		t.Fatalf("an admin adds under invite admins: %v", err)
	}

	// Recalls: an admin recalls anyone's message at any time; a plain
	// member only its own.
	res := send(ctx, l, "own", "o1")
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	refused("a member recalls another's message", store.ErrNotSender, func() error { _, err := l.Recall(ctx, "g", "mem", "", res.Seq, time.Hour); return err })
	if _, err := l.Recall(ctx, "g", "adm", "", res.Seq, 0); err != nil {
		t.Fatalf("an admin recalls another's message past the window: %v", err)
	}

	// Every update is in the log as the members sync it.
	p, err := l.Sync(ctx, "g", "own", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var updates, leaves int
	for _, e := range p.Events {
		switch e.Kind {
		case store.KindUpdate:
			updates++
		case store.KindLeave:
			leaves++
		}
	}
	// role×2, mute, unmute, ban, unban, settings; removal of mem, of x.
	if updates != 7 || leaves != 2 {
		t.Fatalf("the log holds %d updates and %d leaves, want 7 and 2: %+v", updates, leaves, p.Events)
	}
	ms, err := st.Members(ctx, "g", time.Now().UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]string{}
	for _, m := range ms {
		roles[m.User] = m.Role.String()
	}
	if roles["own"] != "owner" || roles["adm"] != "admin" || roles["mem"] != "member" || roles["x"] != "member" {
		t.Fatalf("members %+v", ms)
	}
}
