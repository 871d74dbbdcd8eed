package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// AdvanceDense raises the dense_seq watermark of each conversation to the
// end of the run of seqs that hold rows, starting from its current value
// (migration 0003), and adds the messages it passes to own_msg_buckets
// (migration 0004). A lower bound is always safe: it only makes unread
// counting read a few more index entries. Called after commits.
//
// The conversation rows are locked first, in id order (so concurrent
// callers cannot deadlock), and the second statement's snapshot is taken
// after that: no recall of these conversations can commit in between, so
// each message is counted in its bucket exactly when the watermark passes
// it, as it is at that moment. Every write of a conversation's buckets
// holds that row lock, so the snapshot sees them exactly too: existing
// buckets are raised with a plain UPDATE and new ones inserted (an upsert
// wrote two more WAL records per bucket, to lock the row and to confirm
// the speculative insert).
//
// The two statements go in one batch, in its implicit transaction (as
// lockedRows sends its lock and statement): the row locks are taken,
// used and released within one round trip, never held while PostgreSQL
// waits for the client's next statement or COMMIT. Two statements, not
// one with a locking CTE: that would share one snapshot, taken before
// its locks were granted, and miss a recall committed while it waited.
func (s *Store) AdvanceDense(ctx context.Context, convs []string) error {
	b := &pgx.Batch{}
	b.Queue(`SELECT 1 FROM conversations WHERE conv_id = ANY($1) ORDER BY conv_id FOR UPDATE`, convs)
	b.Queue(advanceDenseSQL, convs)
	br := s.pool.SendBatch(ctx, b)
	defer br.Close()
	for range b.Len() {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	// The implicit transaction commits at the end of the batch: only then
	// is the advance durable.
	return br.Close()
}

// advanceDenseSQL is AdvanceDense's statement, run after its row locks.
const advanceDenseSQL = `
WITH d AS (
    SELECT c.conv_id, c.conv_key, c.dense_seq AS d0,
           coalesce((SELECT max(t.seq) FROM (SELECT e.seq, e.seq - row_number() OVER (ORDER BY e.seq) AS k
                                               FROM events e WHERE e.conv_key = c.conv_key AND e.seq > c.dense_seq) t
                      WHERE t.k = c.dense_seq), c.dense_seq) AS d1
      FROM conversations c WHERE c.conv_id = ANY($1)
), x AS MATERIALIZED (
    SELECT d.conv_id, x.sender, x.bucket, x.n, b.n IS NOT NULL AS known
      FROM d CROSS JOIN unread_settings s
      -- LATERAL: each conversation's new seqs by index; a plain join let
      -- the planner scan every message of the table, growing with it.
      CROSS JOIN LATERAL (SELECT e.sender, e.seq >> s.bucket_bits AS bucket, count(*) AS n
                            FROM events e
                           WHERE e.conv_key = d.conv_key AND e.seq > d.d0 AND e.seq <= d.d1
                             AND e.kind = 1 AND e.recalled_by IS NULL
                           GROUP BY 1, 2) x
      LEFT JOIN own_msg_buckets b ON b.conv_id = d.conv_id AND b.sender = x.sender AND b.bucket = x.bucket
     WHERE d.d1 > d.d0
), raised AS (
    UPDATE own_msg_buckets b SET n = b.n + x.n
      FROM x WHERE x.known AND b.conv_id = x.conv_id AND b.sender = x.sender AND b.bucket = x.bucket
), added AS (
    INSERT INTO own_msg_buckets (conv_id, sender, bucket, n)
    SELECT conv_id, sender, bucket, n FROM x WHERE NOT x.known
)
UPDATE conversations c SET dense_seq = d.d1 FROM d WHERE c.conv_id = d.conv_id AND d.d1 > d.d0`
