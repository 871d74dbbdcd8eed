package fanout

import (
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/test/testenv"
)

// gatewayLoad is a Local whose backlog the test sets.
type gatewayLoad struct{ backlogged atomic.Bool }

func (g *gatewayLoad) Deliver([]Delivery) {}
func (g *gatewayLoad) Backlogged() bool   { return g.backlogged.Load() }

// The dense_seq advance by age waits while the gateway is backlogged (a
// reconnect storm), up to denseDeferMax; a conversation with denseBatch
// events above its watermark is advanced anyway, and a final advance
// (shutdown) takes every one.
func TestAdvanceWaitsForABackloggedGateway(t *testing.T) {
	st, err := store.Open(t.Context(), testenv.PostgresURL(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	f := New(st, nil, nil, nil, Config{WriteMax: 100, OnlineMax: 1000, Workers: 1, AckFlush: time.Second}, slog.Default(), nil)
	load := &gatewayLoad{}
	f.local = load
	now := time.Now()
	f.dirty = map[string]*pendingDense{
		"fresh": {n: 1, since: now},
		"due":   {n: 1, since: now.Add(-denseMaxAge - time.Second)},
		"old":   {n: 1, since: now.Add(-denseDeferMax - time.Second)},
		"hot":   {n: denseBatch, since: now},
	}
	left := func() []string {
		f.dmu.Lock()
		defer f.dmu.Unlock()
		var cs []string
		for c := range f.dirty {
			cs = append(cs, c)
		}
		slices.Sort(cs)
		return cs
	}
	load.backlogged.Store(true)
	f.advance(false)
	if got := left(); !slices.Equal(got, []string{"due", "fresh"}) {
		t.Fatalf("backlogged: left %v, want due and fresh", got)
	}
	load.backlogged.Store(false)
	f.advance(false)
	if got := left(); !slices.Equal(got, []string{"fresh"}) {
		t.Fatalf("not backlogged: left %v, want fresh", got)
	}
	load.backlogged.Store(true)
	f.advance(true)
	if got := left(); len(got) != 0 {
		t.Fatalf("final advance: left %v", got)
	}
}
