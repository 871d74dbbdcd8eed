package route_test

import (
	"context"
	"testing"
	"time"

	"github.com/parley-im/parley/route"
	"github.com/parley-im/parley/scripts"
	"github.com/parley-im/parley/test/testenv"
)

// TestDisconnect: closed connections leave the route table and every
// conversation's online index in one call, each only where its own token
// is still recorded: a device that reconnected meanwhile keeps its new
// route and entries.
func TestDisconnect(t *testing.T) {
	rdb, prefix := testenv.RedisClient(t)
	ctx := context.Background()
	if err := scripts.Load(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	tb := route.New(rdb, prefix, "gw", "boot", time.Minute)
	if err := tb.RenewLease(ctx); err != nil {
		t.Fatal(err)
	}
	register := func(user, device string) int64 {
		tok, _, err := tb.Register(ctx, user, device, 0)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	online := func(conv, user, device string, tok int64) route.OnlineEntry {
		return route.OnlineEntry{Conv: conv, FromSeq: 1, Entry: route.Entry{User: user, Device: device, Token: tok, Gateway: "gw", Boot: "boot"}}
	}
	a1, b1, c1 := register("ana", "a1"), register("ben", "b1"), register("cy", "c1")
	if err := tb.AddOnlineEntries(ctx, []route.OnlineEntry{
		online("big1", "ana", "a1", a1), online("big2", "ana", "a1", a1),
		online("big1", "ben", "b1", b1), online("big1", "cy", "c1", c1),
	}); err != nil {
		t.Fatal(err)
	}
	// ben reconnected before his old connection's close is handled.
	b2 := register("ben", "b1")
	if err := tb.AddOnlineEntries(ctx, []route.OnlineEntry{online("big1", "ben", "b1", b2)}); err != nil {
		t.Fatal(err)
	}
	if err := tb.Disconnect(ctx, []route.Disconnected{{User: "ana", Device: "a1", Token: a1}, {User: "ben", Device: "b1", Token: b1}}); err != nil {
		t.Fatal(err)
	}
	routes, err := tb.Lookup(ctx, []string{"ana", "ben", "cy"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, e := range routes {
		got[e.Device] = e.Token
	}
	if len(got) != 2 || got["b1"] != b2 || got["c1"] != c1 {
		t.Fatalf("routes after the disconnects: %v, want b1 (its new token %d) and c1", got, b2)
	}
	for conv, want := range map[string]map[string]int64{"big1": {"b1": b2, "c1": c1}, "big2": {}} {
		es, err := tb.Online(ctx, conv)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, e := range es {
			got[e.Device] = e.Token
		}
		if len(got) != len(want) || got["b1"] != want["b1"] || got["c1"] != want["c1"] {
			t.Fatalf("%s's online index after the disconnects: %v, want %v", conv, got, want)
		}
	}
}
