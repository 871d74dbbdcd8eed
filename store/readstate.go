package store

import (
	"context"
	"errors"
	"math"
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
	Err      error
}

// markReadsSQL merges a batch of read reports (one per (user, conv)) in one
// statement: each is capped at the end of the user's last membership period
// and max-merged (GREATEST), so it never goes back; unread is derived for
// the merged value. parley_unread_of sees the statement's snapshot, which
// does not include the upsert, so it is given the merged value explicitly.
const markReadsSQL = `
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY AS i(usr, conv, seq, idx)
), facts AS (
    SELECT i.*,
           (SELECT coalesce(max(e.seq), 0) FROM events e
             WHERE e.conv_key = (SELECT c.conv_key FROM conversations c WHERE c.conv_id = i.conv)) AS head,
           p.n, p.last_to,
           (SELECT r.read_seq FROM read_positions r WHERE r.user_id = i.usr AND r.conv_id = i.conv) AS prev
      FROM input i
      CROSS JOIN LATERAL (SELECT count(*) AS n, coalesce(max(coalesce(m.to_seq, $4)), 0) AS last_to
                            FROM membership_periods m WHERE m.conv_id = i.conv AND m.user_id = i.usr) p
), up AS (
    INSERT INTO read_positions (user_id, conv_id, read_seq)
    SELECT usr, conv, least(seq, last_to) FROM facts WHERE n > 0 AND seq <= head ORDER BY usr, conv
    ON CONFLICT (user_id, conv_id) DO UPDATE SET read_seq = GREATEST(read_positions.read_seq, EXCLUDED.read_seq)
    RETURNING user_id, conv_id, read_seq
)
SELECT f.idx, f.n, f.head, up.read_seq, f.prev, coalesce(u.unread, 0)
  FROM facts f LEFT JOIN up ON up.user_id = f.usr AND up.conv_id = f.conv
  LEFT JOIN LATERAL parley_unread_of(f.conv, f.usr, up.read_seq) u ON up.read_seq IS NOT NULL`

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
	rows, err := s.pool.Query(ctx, markReadsSQL, users, convs, seqs, int64(math.MaxInt64))
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var idx, n, head, unread int64
		var read, prev *int64
		if err := rows.Scan(&idx, &n, &head, &read, &prev, &unread); err != nil {
			return err
		}
		r := &out[idx-1]
		switch {
		case n == 0:
			*r = ReadResult{Err: ErrNotMember}
		case read == nil:
			*r = ReadResult{Err: ErrCursorAhead}
		default:
			*r = ReadResult{Read: *read, Unread: unread, Advanced: *read > 0 && (prev == nil || *read > *prev)}
		}
	}
	return rows.Err()
}
