package store

import (
	"context"
	"math"

	"github.com/jackc/pgx/v5"
)

// ClearResult is a user's merged cleared and read positions in a
// conversation after a clear, and the unread count after it.
type ClearResult struct {
	Cleared, Read, Unread int64
	// ReadAdvanced: the read position moved (the user's other devices are
	// told, as for a read report).
	ReadAdvanced bool
	// ReceiptsPrivate: the user hides its read positions (as
	// ReadResult's).
	ReceiptsPrivate bool
}

// clearSQL max-merges user $1's cleared position in conv $2 to $3 capped
// at the end of the user's last membership period, and raises the read
// position to at least it. It runs under the user's read lock (every
// write of read_seq holds it), so its snapshot sees the previous values
// exactly. Rows: none if the user was never a member; head, and
// NULLs when $3 is above head.
const clearSQL = `
WITH facts AS MATERIALIZED (
    SELECT (SELECT coalesce(max(e.seq), 0) FROM events e
             WHERE e.conv_key = (SELECT c.conv_key FROM conversations c WHERE c.conv_id = $2)) AS head,
           p.last_to,
           r.read_seq AS prev_read, r.cleared_seq AS prev_cleared
      FROM (SELECT count(*) AS n, coalesce(max(coalesce(m.to_seq, $4)), 0) AS last_to
              FROM membership_periods m WHERE m.conv_id = $2 AND m.user_id = $1) p
      LEFT JOIN read_positions r ON r.user_id = $1 AND r.conv_id = $2
     WHERE p.n > 0
), want AS MATERIALIZED (
    SELECT greatest(coalesce(prev_cleared, 0), least($3::bigint, last_to)) AS cleared,
           greatest(coalesce(prev_read, 0), least($3::bigint, last_to)) AS read,
           prev_read, prev_cleared
      FROM facts WHERE $3 <= head
), raised AS (
    UPDATE read_positions r SET read_seq = w.read, cleared_seq = w.cleared
      FROM want w WHERE r.user_id = $1 AND r.conv_id = $2 AND w.prev_read IS NOT NULL
       AND (w.read > w.prev_read OR w.cleared > w.prev_cleared)
), added AS (
    INSERT INTO read_positions (user_id, conv_id, read_seq, cleared_seq)
    SELECT $1, $2, w.read, w.cleared FROM want w WHERE w.prev_read IS NULL
)
SELECT f.head, w.cleared, w.read, w.read > coalesce(w.prev_read, 0), u.unread,
       coalesce((SELECT p.receipts_private FROM users p WHERE p.user_id = $1), false)
  FROM facts f
  LEFT JOIN want w ON true
  LEFT JOIN LATERAL parley_unread_of($2, $1, w.read) u ON w.read IS NOT NULL`

// Clear sets user's cleared position in conv to seq ("delete for me"):
// max-merged, capped at the end of the user's last membership period like
// the read position, which it raises to at least the cleared position.
// ErrNotMember if the user was never a member (or conv does not exist),
// ErrCursorAhead if seq is above head; neither changes anything.
func (s *Store) Clear(ctx context.Context, user, conv string, seq int64) (ClearResult, error) {
	var r ClearResult
	found, ahead := false, false
	err := s.lockedRowsGeneric(ctx, lockExclusiveSQL, lockKeys(readLockNS, []string{user}),
		clearSQL, []any{user, conv, seq, int64(math.MaxInt64)}, func(rows pgx.Rows) error {
			var head int64
			var cleared, read, unread *int64
			var advanced *bool
			var private bool
			if err := rows.Scan(&head, &cleared, &read, &advanced, &unread, &private); err != nil {
				return err
			}
			found = true
			if cleared == nil {
				ahead = true
				return nil
			}
			r = ClearResult{Cleared: *cleared, Read: *read, Unread: *unread, ReadAdvanced: *advanced, ReceiptsPrivate: private}
			return nil
		})
	switch {
	case err != nil:
		return ClearResult{}, err
	case !found:
		return ClearResult{}, ErrNotMember
	case ahead:
		return ClearResult{}, ErrCursorAhead
	}
	return r, nil
}
