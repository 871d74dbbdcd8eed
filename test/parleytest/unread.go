package parleytest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// UnreadDefinitionSQL is the unread count as docs/consistency.md ("Unread
// counts") and docs/protocol.md §4 ("unread") define it, written for the tests
// independently of the server's query (store/migrations): the msg events of
// conv ($2) with seq above read ($3), not recalled, not sent by user ($1),
// inside one of user's membership periods [from_seq, to_seq] (to_seq NULL:
// still open). Event kinds are those of store/migrations/0001_init.sql: 0
// hole, 1 msg, 2 join, 3 leave, 4 recall; and 5 edit (0008). Edits are
// never counted (only kind 1 is); a clear ("delete for me") raises the
// read position to at least the cleared one, so the caller passes the
// read position and cleared events are at or below it.
const UnreadDefinitionSQL = `
SELECT count(*) FROM (
    SELECT DISTINCT e.seq
      FROM events e
      JOIN conversations c ON c.conv_key = e.conv_key
      JOIN membership_periods p
        ON p.conv_id = c.conv_id AND p.user_id = $1
       AND e.seq >= p.from_seq AND e.seq <= coalesce(p.to_seq, e.seq)
     WHERE c.conv_id = $2
       AND e.kind = 1
       AND e.recalled_by IS NULL
       AND e.sender IS DISTINCT FROM $1
       AND e.seq > $3
) visible_unread`

// SetUnreadBucketBits sets the width of the own-message buckets that
// unread counting uses (migration 0004) to 2^bits seqs. Call it on a
// database that holds no messages yet: tests use a few bits so that short
// histories cross many bucket boundaries.
func SetUnreadBucketBits(t testing.TB, postgresURL string, bits int) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, postgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM own_msg_buckets`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("SetUnreadBucketBits: own_msg_buckets holds %d rows (%v); call it before any message", n, err)
	}
	if _, err := conn.Exec(ctx, `UPDATE unread_settings SET bucket_bits = $1`, bits); err != nil {
		t.Fatal(err)
	}
}
