package e2e_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/wire"
)

// TestMentionAllRateLimited: sends with mention_all are limited per
// conversation across devices (RATE_LIMITED with retry_after_ms, nothing
// stored); plain sends and other conversations are not; an outsider gets
// NOT_MEMBER without spending the budget.
func TestMentionAllRateLimited(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	cfg.MentionAllRate, cfg.MentionAllPeriod = 2, time.Minute
	env := parleytest.Start(t, cfg)
	ana := env.User(t, "ana", 1)
	ben := env.User(t, "ben", 1)
	out := env.User(t, "out", 1)
	env.Group(t, "g1", "ana", "ben")
	env.Group(t, "g2", "ana", "ben")
	ca, _ := dial(t, env, ana[0])
	cb, _ := dial(t, env, ben[0])
	co, _ := dial(t, env, out[0])
	// An outsider cannot spend g1's budget.
	for i := 0; i < 3; i++ {
		if _, err := co.Do(ctx(t), wire.Request{T: wire.TSend, Conv: "g1", Cmid: fmt.Sprint("o", i), Body: []byte("@all"), MentionAll: true}); wire.CodeOf(err) != wire.NotMember {
			t.Fatalf("outsider's mention_all: %v", err)
		}
	}
	// Two per minute in g1, from any member's device.
	if _, err := ca.Do(ctx(t), wire.Request{T: wire.TSend, Conv: "g1", Cmid: "m1", Body: []byte("@all"), MentionAll: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Do(ctx(t), wire.Request{T: wire.TSend, Conv: "g1", Cmid: "m2", Body: []byte("@all"), MentionAll: true}); err != nil {
		t.Fatal(err)
	}
	head, err := ca.Sync(ctx(t), "g1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ca.Do(ctx(t), wire.Request{T: wire.TSend, Conv: "g1", Cmid: "m3", Body: []byte("@all"), MentionAll: true})
	e, ok := wire.AsError(err)
	if !ok || e.Code != wire.RateLimited || e.RetryAfterMs <= 0 || e.RetryAfterMs > 60_000 {
		t.Fatalf("third mention_all in a minute: %v", err)
	}
	after, err := ca.Sync(ctx(t), "g1", 0, 0)
	if err != nil || after.Head != head.Head {
		t.Fatalf("a refused mention_all stored something: head %d → %d (%v)", head.Head, after.Head, err)
	}
	// Plain sends, and mention_all elsewhere, go on.
	if _, err := ca.Send(ctx(t), "g1", "plain", []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Do(ctx(t), wire.Request{T: wire.TSend, Conv: "g2", Cmid: "m1", Body: []byte("@all"), MentionAll: true}); err != nil {
		t.Fatal(err)
	}
}
