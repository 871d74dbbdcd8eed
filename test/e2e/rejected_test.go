package e2e_test

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
	"github.com/parley-im/parley/wire"
)

// A rejected request changes nothing (docs/protocol.md §3): it allocates
// no seq, so the conversation's head does not move and no hole is
// written. Every request that can allocate a seq is refused here in
// every way it can be, through the wire and the admin API, on two
// gateways (so one of them still has the user's membership cached when
// the other removed them), and head is compared before and after.
func TestRejectedRequestsChangeNothing(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	cfg.RecallWindow = time.Second
	gw1 := parleytest.Start(t, cfg)
	gw2 := parleytest.Start(t, cfg)
	ana := gw1.User(t, "ana", 1)[0]
	ben := gw1.User(t, "ben", 1)[0]
	gone := gw1.User(t, "gone", 1)[0] // removed on gw2 while cached on gw1
	out := gw1.User(t, "out", 1)[0]   // never a member
	gw1.Group(t, "g", "ana", "ben", "gone")
	ca, _ := dial(t, gw1, ana)
	cb, _ := dial(t, gw1, ben)
	cg, _ := dial(t, gw1, gone)
	co, _ := dial(t, gw2, out)

	old, err := ca.Send(ctx(t), "g", "old", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cg.Send(ctx(t), "g", "cached", []byte("x")); err != nil { // gw1 caches gone's membership
		t.Fatal(err)
	}
	// gw2 removes gone; gw1's membership check hears of it on the bus
	// (a send refused by a stale cache would be refused only at commit,
	// its seq a hole). eventlog's TestRejectedChangesAllocateNothing
	// covers a cache that never hears of it.
	if st := gw2.Admin(t, "DELETE", "/v1/conversations/g/members/gone", nil, nil); st != http.StatusOK {
		t.Fatalf("removing gone: %d", st)
	}
	testenv.CheckFor(t, 5*time.Second, time.Millisecond, func() error {
		if n := gw1.Srv.MetricSum("parley_membership_removal_notices_total"); n < 1 {
			return fmt.Errorf("gw1 heard of %v removals", n)
		}
		return nil
	})
	last, err := ca.Send(ctx(t), "g", "last", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}

	head := func() int64 { return headOf(t, gw1, "g") }
	before := head()
	unchanged := func(what string) {
		t.Helper()
		if h := head(); h != before {
			t.Fatalf("%s moved head %d -> %d", what, before, h)
		}
	}
	wantCode := func(what string, err error, code wire.Code) {
		t.Helper()
		if wire.CodeOf(err) != code {
			t.Fatalf("%s: %v, want %s", what, err, code)
		}
		unchanged(what)
	}

	// Membership changes through the wire.
	_, err = ca.AddMembers(ctx(t), "g", "ben", "no-such-user")
	wantCode("members_add naming an unknown user", err, wire.NotFound)
	_, err = ca.AddMembers(ctx(t), "g", "ben")
	if err != nil {
		t.Fatalf("members_add of a current member: %v", err)
	}
	unchanged("members_add of current members only")
	_, err = co.AddMembers(ctx(t), "g", "out")
	wantCode("members_add by a user who was never a member", err, wire.NotMember)
	_, err = cg.AddMembers(ctx(t), "g", "out")
	wantCode("members_add by a user removed on another gateway", err, wire.NotMember)
	_, err = co.Leave(ctx(t), "g")
	wantCode("leave by a user who was never a member", err, wire.NotMember)
	_, err = cg.Leave(ctx(t), "g")
	wantCode("leave by a user removed on another gateway", err, wire.NotMember)
	_, err = ca.Leave(ctx(t), "no-such-conv")
	wantCode("leave of a conversation that does not exist", err, wire.NotMember)

	// Sends.
	_, err = co.Send(ctx(t), "g", "s1", []byte("x"))
	wantCode("send by a user who was never a member", err, wire.NotMember)
	_, err = cg.Send(ctx(t), "g", "s2", []byte("x"))
	wantCode("send by a user removed on another gateway", err, wire.NotMember)
	_, err = ca.Send(ctx(t), "g", "big", bytes.Repeat([]byte("x"), cfg.MaxBody+1))
	wantCode("send over max_body", err, wire.TooLarge)
	if r, err := ca.Send(ctx(t), "g", "old", []byte("x")); err != nil || !r.Dup || r.Seq != old.Seq {
		t.Fatalf("resend of a cmid: %+v %v", r, err)
	}
	unchanged("resend of a confirmed send") // not a refusal, but it allocates nothing either

	// Recalls.
	_, err = ca.Recall(ctx(t), "g", 1)
	wantCode("recall of a join", err, wire.NotFound)
	_, err = ca.Recall(ctx(t), "g", before+100)
	wantCode("recall of a seq above head", err, wire.NotFound)
	_, err = cb.Recall(ctx(t), "g", last.Seq)
	wantCode("recall of another member's message", err, wire.NotSender)
	_, err = co.Recall(ctx(t), "g", last.Seq)
	wantCode("recall by a user who was never a member", err, wire.NotMember)
	_, err = cg.Recall(ctx(t), "g", 3)
	wantCode("recall by a user removed on another gateway", err, wire.NotMember)
	r1, err := ca.Recall(ctx(t), "g", last.Seq)
	if err != nil {
		t.Fatal(err)
	}
	before = head() // the recall took a seq
	if r2, err := ca.Recall(ctx(t), "g", last.Seq); err != nil || r2.Seq != r1.Seq {
		t.Fatalf("recalling again: %+v %v, want the first recall_ok (%d)", r2, err, r1.Seq)
	}
	unchanged("recalling a recalled message again")
	time.Sleep(cfg.RecallWindow) // the window passing is what is tested
	_, err = ca.Recall(ctx(t), "g", old.Seq)
	wantCode("recall after recall_window", err, wire.RecallWindow)

	// Edits and clears.
	_, err = cg.Edit(ctx(t), "g", 3, []byte("y"))
	wantCode("edit by a user removed on another gateway", err, wire.NotMember)
	_, err = cb.Edit(ctx(t), "g", old.Seq, []byte("y"))
	wantCode("edit of another member's message", err, wire.NotSender)
	_, err = ca.Edit(ctx(t), "g", last.Seq, []byte("y"))
	wantCode("edit of a recalled message", err, wire.NotFound)
	_, err = ca.Edit(ctx(t), "g", old.Seq, bytes.Repeat([]byte("x"), cfg.MaxBody+1))
	wantCode("edit over max_body", err, wire.TooLarge)
	_, err = ca.Clear(ctx(t), "g", before+1)
	wantCode("clear beyond head", err, wire.CursorAhead)
	_, err = co.Clear(ctx(t), "g", 1)
	wantCode("clear by a user who was never a member", err, wire.NotMember)

	// Conversations that fail to be created do not exist.
	_, err = ca.CreateGroup(ctx(t), "g-new", "", "ben", "no-such-user")
	if wire.CodeOf(err) != wire.NotFound {
		t.Fatalf("conv_create naming an unknown user: %v, want NOT_FOUND", err)
	}
	if st := gw1.Admin(t, "GET", "/v1/conversations/g-new", nil, nil); st != http.StatusNotFound {
		t.Fatalf("g-new after its failed creation: %d, want 404", st)
	}

	// The admin API.
	for _, c := range []struct {
		what, method, path string
		body               any
		status             int
	}{
		{"adding an unknown user", "POST", "/v1/conversations/g/members", map[string]any{"users": []string{"ben", "no-such-user"}}, http.StatusNotFound},
		{"removing a user who is not a member", "DELETE", "/v1/conversations/g/members/out", nil, http.StatusNotFound},
		{"removing a user removed before", "DELETE", "/v1/conversations/g/members/gone", nil, http.StatusNotFound},
		{"removing an unknown user", "DELETE", "/v1/conversations/g/members/no-such-user", nil, http.StatusNotFound},
		{"adding current members only", "POST", "/v1/conversations/g/members", map[string]any{"users": []string{"ana", "ben"}}, http.StatusOK},
	} {
		var e struct{ Code, Msg string }
		if st := gw2.Admin(t, c.method, c.path, c.body, &e); st != c.status {
			t.Fatalf("admin %s: %d %+v, want %d", c.what, st, e, c.status)
		}
		unchanged("admin " + c.what)
	}
	// A bulk creation with one bad conversation creates none of them.
	var e struct{ Code, Msg string }
	st := gw1.Admin(t, "POST", "/v1/bulk/conversations", map[string]any{"conversations": []map[string]any{
		{"id": "b1", "kind": "group", "members": []string{"ana"}},
		{"id": "b2", "kind": "group", "members": []string{"ana", "no-such-user"}},
	}}, &e)
	if st != http.StatusNotFound || e.Code != string(wire.NotFound) {
		t.Fatalf("bulk creation naming an unknown user: %d %+v, want 404 NOT_FOUND", st, e)
	}
	st = gw1.Admin(t, "POST", "/v1/bulk/conversations", map[string]any{"conversations": []map[string]any{
		{"id": "b1", "kind": "group", "members": []string{"ana"}},
		{"id": "g", "kind": "group", "members": []string{"ana"}},
	}}, &e)
	if st != http.StatusConflict || e.Code != string(wire.Exists) {
		t.Fatalf("bulk creation naming a taken id: %d %+v, want 409 EXISTS", st, e)
	}
	if st := gw1.Admin(t, "GET", "/v1/conversations/b1", nil, nil); st != http.StatusNotFound {
		t.Fatalf("b1 after failed bulk creations: %d, want 404", st)
	}
}

// TestAdminUnknownRoutesAnswerJSON: a path or method the admin API does
// not have is answered like every other error, {code, msg} in JSON.
func TestAdminUnknownRoutesAnswerJSON(t *testing.T) {
	t.Parallel()
	env := parleytest.Start(t, parleytest.Config(t))
	for _, c := range []struct {
		method, path string
		status       int
		code         wire.Code
	}{
		{"GET", "/v1/nothing-here", http.StatusNotFound, wire.NotFound},
		{"PUT", "/v1/users", http.StatusMethodNotAllowed, wire.BadRequest},
	} {
		var e struct{ Code, Msg string }
		if st := env.Admin(t, c.method, c.path, nil, &e); st != c.status || e.Code != string(c.code) || e.Msg == "" {
			t.Fatalf("%s %s: %d %+v, want %d %s", c.method, c.path, st, e, c.status, c.code)
		}
	}
}
