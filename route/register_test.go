package route_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/parley-im/parley/route"
	"github.com/parley-im/parley/scripts"
	"github.com/parley-im/parley/test/testenv"
)

// TestRegisterMany: connections registered in one pipeline get the same
// outcome each as one Register call: a new token, the entry it replaced,
// or ErrFenced for a re-registration that a newer connection overtook.
// A Redis without the scripts (flushed) gets them loaded again.
func TestRegisterMany(t *testing.T) {
	rdb, prefix := testenv.RedisClient(t)
	ctx := context.Background()
	a := route.New(rdb, prefix, "gw-a", "boot-a", time.Minute)
	b := route.New(rdb, prefix, "gw-b", "boot-b", time.Minute)
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	old, _, err := b.Register(ctx, "ben", "b1", 0) // loads the scripts again
	if err != nil {
		t.Fatal(err)
	}
	newer, _, err := b.Register(ctx, "cy", "c1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := scripts.Load(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	got := a.RegisterMany(ctx, []route.Registration{
		{User: "ana", Device: "a1"},                  // first connection of a1
		{User: "ben", Device: "b1"},                  // b1 moves from gw-b to gw-a
		{User: "cy", Device: "c1", Token: newer - 1}, // an older connection of c1
		{User: "ana", Device: "a2"},
	})
	if len(got) != 4 {
		t.Fatalf("%d outcomes for 4 registrations", len(got))
	}
	for i, r := range []route.Registered{got[0], got[1], got[3]} {
		if r.Err != nil || r.Token <= 0 {
			t.Fatalf("registration %d: %+v", i, r)
		}
	}
	if got[0].Prev != nil || got[3].Prev != nil {
		t.Fatalf("first connections replaced %+v, %+v", got[0].Prev, got[3].Prev)
	}
	if p := got[1].Prev; p == nil || p.Gateway != "gw-b" || p.Boot != "boot-b" || p.Token != old || got[1].Token <= old {
		t.Fatalf("b1 moved: %+v replacing %+v (old token %d)", got[1], p, old)
	}
	if r := got[2]; !errors.Is(r.Err, route.ErrFenced) || r.Prev == nil || r.Prev.Token != newer {
		t.Fatalf("an older connection of c1: %+v (newer token %d)", r, newer)
	}
	// What Lookup sees is what the pipeline wrote.
	for _, tb := range []*route.Table{a, b} {
		if err := tb.RenewLease(ctx); err != nil {
			t.Fatal(err)
		}
	}
	routes, err := a.Lookup(ctx, []string{"ana", "ben", "cy"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a1": "gw-a", "a2": "gw-a", "b1": "gw-a", "c1": "gw-b"}
	for _, e := range routes {
		if want[e.Device] != e.Gateway {
			t.Fatalf("route of %s on %s, want %s", e.Device, e.Gateway, want[e.Device])
		}
		delete(want, e.Device)
	}
	if len(want) > 0 {
		t.Fatalf("no route for %v", want)
	}
}
