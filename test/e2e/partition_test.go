package e2e_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/wire"
)

// partitionEventsSQL turns the events table into one hash-partitioned by
// conversation (docs/operations.md shows the same for an operator): every
// key and index leads with conv_key, so nothing in the code changes.
const partitionEventsSQL = `
ALTER TABLE events RENAME TO events_plain;
CREATE TABLE events (LIKE events_plain INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY HASH (conv_key);
CREATE TABLE events_p0 PARTITION OF events FOR VALUES WITH (MODULUS 4, REMAINDER 0);
CREATE TABLE events_p1 PARTITION OF events FOR VALUES WITH (MODULUS 4, REMAINDER 1);
CREATE TABLE events_p2 PARTITION OF events FOR VALUES WITH (MODULUS 4, REMAINDER 2);
CREATE TABLE events_p3 PARTITION OF events FOR VALUES WITH (MODULUS 4, REMAINDER 3);
INSERT INTO events SELECT * FROM events_plain;
DROP TABLE events_plain;
ALTER TABLE events ADD PRIMARY KEY (conv_key, seq);
CREATE UNIQUE INDEX events_by_cmid_hash ON events (conv_key, parley_cmid_hash(sender, cmid)) WHERE cmid IS NOT NULL AND cmid_collided IS NULL;
CREATE UNIQUE INDEX events_by_cmid_collided ON events (conv_key, sender, cmid) WHERE cmid_collided;
CREATE INDEX events_not_counted ON events (conv_key, seq) WHERE kind <> 1 OR recalled_by IS NOT NULL;
`

// TestEventsHashPartitionedByConversation runs the main paths (send with
// dedupe, sync, ack, read, convs, recall, snapshot, leave) on a schema whose
// events table is hash-partitioned by conv_key.
func TestEventsHashPartitionedByConversation(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	c := context.Background()
	st, err := store.Open(c, cfg.PostgresURL, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(c); err != nil {
		t.Fatal(err)
	}
	st.Close()
	conn, err := pgx.Connect(c, cfg.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(c, partitionEventsSQL); err != nil {
		t.Fatal(err)
	}
	var parts int
	_ = conn.QueryRow(c, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'events'::regclass`).Scan(&parts)
	conn.Close(c)
	if parts != 4 {
		t.Fatalf("%d partitions", parts)
	}

	env := parleytest.Start(t, cfg)
	ana := env.User(t, "ana", 1)
	ben := env.User(t, "ben", 1)
	for g := 0; g < 8; g++ { // spread over the partitions
		env.Group(t, fmt.Sprintf("g%d", g), "ana", "ben")
	}
	ca, _ := dial(t, env, ana[0])
	cb, fb := dial(t, env, ben[0])
	for g := 0; g < 8; g++ {
		conv := fmt.Sprintf("g%d", g)
		var last int64
		for i := 0; i < 5; i++ {
			r, err := ca.Send(ctx(t), conv, fmt.Sprint(i), []byte("m"))
			if err != nil {
				t.Fatal(err)
			}
			last = r.Seq
		}
		if d, err := ca.Send(ctx(t), conv, "0", []byte("m")); err != nil || !d.Dup || d.Seq != 2 {
			t.Fatalf("dup on %s: %+v %v", conv, d, err)
		}
		waitPush(t, fb, conv, last)
		evs, upto := syncAll(t, cb, conv, 0)
		// 1 join + 5 messages; the duplicate took no seq.
		if upto != last || len(evs) != 6 {
			t.Fatalf("sync %s: upto %d, %d events", conv, upto, len(evs))
		}
		if a, err := cb.Ack(ctx(t), conv, last); err != nil || a.Delivered != last {
			t.Fatalf("ack: %+v %v", a, err)
		}
		if r, err := cb.Read(ctx(t), conv, 3); err != nil || r.Unread != 3 {
			t.Fatalf("read: %+v %v", r, err)
		}
		if _, err := ca.Recall(ctx(t), conv, last); err != nil {
			t.Fatal(err)
		}
	}
	cv, err := cb.Convs(ctx(t), 0, "")
	if err != nil || len(cv.Items) != 8 {
		t.Fatalf("convs: %+v %v", cv, err)
	}
	for _, it := range cv.Items {
		if it.Unread != 2 || it.Read != 3 || it.Head != 7 { // join, 5 messages, the recall
			t.Fatalf("item %+v", it)
		}
	}
	sn, err := cb.Snapshot(ctx(t), []wire.ConvAfter{{Conv: "g0", After: 0}})
	if err != nil || len(sn.Items) != 1 || len(sn.Items[0].Events) != 7 {
		t.Fatalf("snapshot: %+v %v", sn, err)
	}
	if _, err := cb.Leave(ctx(t), "g0"); err != nil {
		t.Fatal(err)
	}
}
