package store

import (
	"context"
	"errors"
	"math"

	"github.com/jackc/pgx/v5"
)

// Read positions: one per (user, conversation), max-merged, capped at the
// end of the user's last membership period. Unread counts are derived
// from the events on every call (the parley_unread functions of
// migration 0004), never stored (docs/consistency.md, "Unread counts").

// ReadUpdate is one read report: user has read conv up to Seq.
type ReadUpdate struct {
	User string
	Conv string
	Seq  int64
}

// ReadResult is the merged read position and the unread count after it,
// or why the report was refused (Err: ErrNotMember if the user was never
// a member, ErrCursorAhead if Seq is above head).
type ReadResult struct {
	Read     int64
	Unread   int64
	Advanced bool // the position moved (other devices are told)
	// ReceiptsPrivate: the user hides its read positions (no receipt is
	// pushed for this one), as of the merge's transaction; read only when
	// the position moved (Advanced), false otherwise.
	ReceiptsPrivate bool
	Err             error
}

// markReadsSQL merges a batch of read reports (one per (user, conv)) in one
// statement: each is capped at the end of the user's last membership period
// and max-merged, so it never goes back; unread is derived for the merged
// value. It runs after lockExclusiveSQL has taken the batch's users' read
// locks, so its snapshot sees their read positions exactly (every write of
// a read position holds its user's lock): it raises (UPDATE) or adds
// (INSERT) only the positions that move. An upsert wrote a WAL record per
// row only to lock it, and rewrote positions that did not move.
// parley_unread_at sees the statement's snapshot, which does not include
// the writes, so it is given the merged value explicitly (and the
// conversation's key, head and dense_seq read in facts). Each report's
// conversation is looked up by its index (LATERAL … LIMIT 1): written as
// a join, the generic plan hashed a sequential scan of conversations
// for every batch. The reader's receipts_private comes back with the
// merge, so a receipt needs nothing more from PostgreSQL.
const markReadsSQL = `
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY AS i(usr, conv, seq, idx)
), facts AS MATERIALIZED (
    SELECT i.*, c.conv_key AS key, coalesce(c.dense_seq, 0) AS w,
           (SELECT coalesce(max(e.seq), 0) FROM events e WHERE e.conv_key = c.conv_key) AS head,
           p.n, p.last_to,
           (SELECT r.read_seq FROM read_positions r WHERE r.user_id = i.usr AND r.conv_id = i.conv) AS prev
      FROM input i
      LEFT JOIN LATERAL (SELECT c.conv_key, c.dense_seq FROM conversations c WHERE c.conv_id = i.conv LIMIT 1) c ON true
      CROSS JOIN LATERAL (SELECT count(*) AS n, coalesce(max(coalesce(m.to_seq, $4)), 0) AS last_to
                            FROM membership_periods m WHERE m.conv_id = i.conv AND m.user_id = i.usr) p
), want AS MATERIALIZED (
    SELECT usr, conv, prev, least(seq, last_to) AS target FROM facts WHERE n > 0 AND seq <= head
), raised AS (
    UPDATE read_positions r SET read_seq = w.target
      FROM want w WHERE r.user_id = w.usr AND r.conv_id = w.conv AND w.prev < w.target
), added AS (
    INSERT INTO read_positions (user_id, conv_id, read_seq)
    SELECT usr, conv, target FROM want WHERE prev IS NULL
)
SELECT f.idx, f.n, f.head, w.merged, f.prev, coalesce(u.unread, 0),
       -- only for a position that moved (a receipt is sent for nothing else)
       coalesce(CASE WHEN w.merged > coalesce(f.prev, 0)
                     THEN (SELECT p.receipts_private FROM users p WHERE p.user_id = f.usr) END, false)
  FROM facts f
  LEFT JOIN (SELECT usr, conv, greatest(coalesce(prev, target), target) AS merged FROM want) w ON w.usr = f.usr AND w.conv = f.conv
  LEFT JOIN LATERAL parley_unread_at(f.conv, f.usr, w.merged, f.key, f.head, f.w) u ON w.merged IS NOT NULL`

// MarkReads max-merges a batch of read reports in one statement (group
// commit). Reports of one batch for the same (user, conv) are merged first.
func (s *Store) MarkReads(ctx context.Context, ups []ReadUpdate) ([]ReadResult, error) {
	type key struct{ user, conv string }
	index := map[key]int{}
	count := map[key]int{}
	var users, convs []string
	var seqs []int64
	for _, u := range ups {
		k := key{u.User, u.Conv}
		count[k]++
		if i, ok := index[k]; ok {
			seqs[i] = max(seqs[i], u.Seq)
			continue
		}
		index[k] = len(users)
		users, convs, seqs = append(users, u.User), append(convs, u.Conv), append(seqs, u.Seq)
	}
	merged := make([]ReadResult, len(users))
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		err = s.markReads(ctx, users, convs, seqs, merged)
		if !isDeadlock(err) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	res := make([]ReadResult, len(ups))
	for i, u := range ups {
		k := key{u.User, u.Conv}
		m := merged[index[k]]
		if errors.Is(m.Err, ErrCursorAhead) && count[k] > 1 && u.Seq < seqs[index[k]] {
			// The merged (largest) report was above head; this smaller one
			// may not be: answer it on its own.
			one, err := s.MarkReads(ctx, []ReadUpdate{u})
			if err != nil {
				return nil, err
			}
			m = one[0]
		}
		res[i] = m
	}
	return res, nil
}

func (s *Store) markReads(ctx context.Context, users, convs []string, seqs []int64, out []ReadResult) error {
	// The merged positions are durable once lockedRows returns nil (the
	// transaction commits at the end of the batch).
	return s.lockedRowsGeneric(ctx, lockExclusiveSQL, lockKeys(readLockNS, users),
		markReadsSQL, []any{users, convs, seqs, int64(math.MaxInt64)},
		func(rows pgx.Rows) error {
			var idx, n, head, unread int64
			var read, prev *int64
			var private bool
			if err := rows.Scan(&idx, &n, &head, &read, &prev, &unread, &private); err != nil {
				return err
			}
			r := &out[idx-1]
			switch {
			case n == 0:
				*r = ReadResult{Err: ErrNotMember}
			case read == nil:
				*r = ReadResult{Err: ErrCursorAhead}
			default:
				*r = ReadResult{Read: *read, Unread: unread, Advanced: *read > 0 && (prev == nil || *read > *prev), ReceiptsPrivate: private}
			}
			return nil
		})
}
