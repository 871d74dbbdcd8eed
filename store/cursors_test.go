package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/internal/parleytest"
	"github.com/parley-im/parley/store"
)

// An ack of an old install that is still in flight when the device is
// reinstalled may write its cursor row after the reinstall deleted the
// device's cursors (acks do not lock the device row). That row must change
// nothing the new install sees (M5): convs skips it, the new install's
// first ack replaces it instead of max-merging with it, and a later ack of
// the old install is refused. The race is produced by writing the row the
// late ack would have written.
func TestCursorOfOldInstallWrittenAfterReinstall(t *testing.T) {
	env := parleytest.Start(t, parleytest.Config(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ana := env.User(t, "ana", 1)[0]
	ben := env.User(t, "ben", 1)[0]
	env.Group(t, "g", "ana", "ben") // seq 1
	ca, err := client.Dial(ctx, env.Addr, ana.ID, ana.Token, client.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	for _, cmid := range []string{"m2", "m3", "m4", "m5"} {
		if _, err := ca.Send(ctx, "g", cmid, []byte(cmid)); err != nil {
			t.Fatal(err)
		}
	}
	st, err := store.Open(ctx, env.Cfg.PostgresURL, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	merge := func(epoch, seq int64) store.CursorResult {
		t.Helper()
		res, err := st.MergeCursors(ctx, []store.CursorUpdate{{Device: ben.ID, User: "ben", Conv: "g", Epoch: epoch, Seq: seq}})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	delivered := func() int64 {
		t.Helper()
		items, _, _, _, err := st.Conversations(ctx, "ben", ben.ID, 10, nil, store.ConvOrder{})
		if err != nil || len(items) != 1 {
			t.Fatalf("convs: %+v, %v", items, err)
		}
		return items[0].Delivered
	}

	if r := merge(0, 3); r.Err != nil || r.Delivered != 3 {
		t.Fatalf("ack 3 on install 0: %+v", r)
	}
	epoch, err := st.Reinstall(ctx, ben.ID)
	if err != nil || epoch != 1 {
		t.Fatalf("reinstall: %d, %v", epoch, err)
	}
	// The late ack of install 0 lands now.
	raw, err := pgx.Connect(ctx, env.Cfg.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close(ctx)
	if _, err := raw.Exec(ctx, `INSERT INTO device_cursors (device_id, conv_id, install_epoch, delivered_seq) VALUES ($1, 'g', 0, 5)`, ben.ID); err != nil {
		t.Fatal(err)
	}
	if d := delivered(); d != 0 {
		t.Fatalf("convs shows delivered %d to the new install; want 0 (the old install's row is not its cursor)", d)
	}
	if r := merge(1, 2); r.Err != nil || r.Delivered != 2 {
		t.Fatalf("first ack of install 1 (seq 2): %+v; want delivered 2, not merged with the old install's 5", r)
	}
	if d := delivered(); d != 2 {
		t.Fatalf("convs: delivered %d, want 2", d)
	}
	if r := merge(0, 5); !errors.Is(r.Err, store.ErrStaleInstall) {
		t.Fatalf("ack of install 0 after the reinstall: %+v; want ErrStaleInstall", r)
	}
	// A row of a newer install is never touched by an older one's ack, even
	// one that got past the epoch check just before a second reinstall.
	if _, err := raw.Exec(ctx, `UPDATE device_cursors SET install_epoch = 2, delivered_seq = 1 WHERE device_id = $1`, ben.ID); err != nil {
		t.Fatal(err)
	}
	if r := merge(1, 4); r.Err == nil {
		t.Fatalf("ack of install 1 over a row of install 2: %+v; want it refused", r)
	}
	var e, d int64
	if err := raw.QueryRow(ctx, `SELECT install_epoch, delivered_seq FROM device_cursors WHERE device_id = $1`, ben.ID).Scan(&e, &d); err != nil || e != 2 || d != 1 {
		t.Fatalf("row after the refused ack: epoch %d seq %d (%v); want 2, 1", e, d, err)
	}
}
