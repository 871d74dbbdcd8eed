package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/test/testenv"
)

// PlanSnapshots plans the snapshot statement on every connection of the
// snapshot pool. Before the schema exists it fails, and the connections it
// failed on (each in a failed transaction) are not handed out again:
// once migrated, snapshots on all of them, at once, succeed.
func TestPlanSnapshots(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := store.Open(ctx, testenv.PostgresURL(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.PlanSnapshots(ctx); err == nil {
		t.Fatal("planned the snapshot statement without a schema")
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.PlanSnapshots(ctx); err != nil {
		t.Fatalf("planning on the migrated schema: %v", err)
	}
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			q := store.SnapshotQuery{User: fmt.Sprintf("u%d", i), Convs: []string{"nowhere"}, Afters: []int64{0}}
			items, err := st.SnapshotBatch(ctx, []store.SnapshotQuery{q}, 100, 20)
			if err == nil && (len(items) != 1 || len(items[0]) != 1 || !errors.Is(items[0][0].Err, store.ErrNotMember)) {
				err = fmt.Errorf("items %+v, want one item failed with ErrNotMember", items)
			}
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
