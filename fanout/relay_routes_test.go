package fanout

import (
	"testing"
	"time"

	"github.com/parley-im/parley/route"
)

// TestRelayRoutesKeptPerUser: a connection of one user opening or closing
// while a batch's routes are looked up keeps only that user's routes out
// of the cache; the other users' are kept, so that typing and receipts
// still reuse routes during a reconnect storm.
func TestRelayRoutesKeptPerUser(t *testing.T) {
	f := &Fanout{}
	byUser := map[string][]route.Entry{
		"ana": {{User: "ana", Device: "ana-1", Token: 1, Gateway: "g"}},
		"ben": {{User: "ben", Device: "ben-1", Token: 1, Gateway: "g"}},
	}
	f.RoutesChanged("cy") // before the batch: not remembered
	if len(f.routeChanged) != 0 {
		t.Fatalf("a change outside a lookup was remembered: %v", f.routeChanged)
	}
	f.rmu.Lock()
	clear(f.routeChanged) // a batch begins and looks ana and ben up (notify)
	f.looking = true
	f.rmu.Unlock()
	f.RoutesChanged("ben") // ben's second device connects during the lookup
	f.keepRelayRoutes([]string{"ana", "ben"}, byUser, time.Now())
	if _, ok := f.relayRoutes["ana"]; !ok {
		t.Fatal("ana's routes were not kept, though only ben's changed")
	}
	if _, ok := f.relayRoutes["ben"]; ok {
		t.Fatal("ben's routes were kept, though they changed during the lookup")
	}
	if f.looking || len(f.routeChanged) != 0 {
		t.Fatalf("after the lookup: looking %v, changed %v", f.looking, f.routeChanged)
	}
	// The next batch looks ben up again and keeps the result.
	f.rmu.Lock()
	f.looking = true
	f.rmu.Unlock()
	f.keepRelayRoutes([]string{"ben"}, byUser, time.Now())
	if _, ok := f.relayRoutes["ben"]; !ok {
		t.Fatal("ben's routes were not kept by the next batch")
	}
}
