package fanout

import (
	"context"
	"testing"
	"time"

	"github.com/parley-im/parley/test/testenv"
)

// TestLifecycleStream: notices reach a follower in order, and a follower
// that stopped (a gateway that lost Redis for a while) resumes after the
// last notice it saw, missing none and repeating none.
func TestLifecycleStream(t *testing.T) {
	rdb, prefix := testenv.RedisClient(t)
	b := NewBus(rdb, prefix, "gw-test")
	ctx := t.Context()
	if err := b.Lifecycle(ctx, Lifecycle{Device: "before", Reason: "revoked"}); err != nil {
		t.Fatal(err)
	}
	from, err := b.LifecycleFrom(ctx)
	if err != nil {
		t.Fatal(err)
	}
	follow := func(from string, want int) []Lifecycle {
		t.Helper()
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		got := make(chan Lifecycle, 100)
		done := make(chan struct{})
		go func() { defer close(done); b.FollowLifecycle(fctx, from, func(l Lifecycle) { got <- l }) }()
		var out []Lifecycle
		for len(out) < want {
			select {
			case l := <-got:
				out = append(out, l)
			case <-fctx.Done():
				t.Fatalf("got %d notices of %d", len(out), want)
			}
		}
		cancel()
		<-done
		select {
		case l := <-got:
			t.Fatalf("an extra notice %+v", l)
		default:
		}
		return out
	}
	for _, d := range []string{"d1", "d2", "d3"} {
		if err := b.Lifecycle(ctx, Lifecycle{Device: d, Reason: "revoked"}); err != nil {
			t.Fatal(err)
		}
	}
	got := follow(from, 3)
	if got[0].Device != "d1" || got[1].Device != "d2" || got[2].Device != "d3" {
		t.Fatalf("%+v", got)
	}
	// Resume after d2: only d3 and what came since.
	ids, err := rdb.XRange(ctx, b.lifecycleKey(), "-", "+").Result()
	if err != nil || len(ids) != 4 {
		t.Fatalf("%v %v", ids, err)
	}
	if err := b.Lifecycle(ctx, Lifecycle{User: "u", Reason: "suspended"}); err != nil {
		t.Fatal(err)
	}
	got = follow(ids[2].ID, 2)
	if got[0].Device != "d3" || got[1].User != "u" || got[1].Reason != "suspended" {
		t.Fatalf("resumed: %+v", got)
	}
}
