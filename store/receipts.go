package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// UserRead is one member's read position.
type UserRead struct {
	User string
	Read int64
}

// Receipts is what a receipts request shows a current member of a
// conversation: the conversation's member count (the caller decides the
// tier) and the read positions of its current members, those with private
// receipts left out (0 for a member who never read).
type Receipts struct {
	Members int64
	Reads   []UserRead
}

// Receipts returns conv's receipts as seen by user: ErrNotMember unless
// user is a current member (or if conv does not exist). One snapshot.
func (s *Store) Receipts(ctx context.Context, conv, user string) (Receipts, error) {
	var r Receipts
	err := s.readTx(ctx, func(tx pgx.Tx) error {
		var member bool
		err := tx.QueryRow(ctx, `SELECT c.member_count, EXISTS (SELECT 1 FROM membership_periods m
				WHERE m.conv_id = c.conv_id AND m.user_id = $2 AND m.to_seq IS NULL)
			FROM conversations c WHERE c.conv_id = $1`, conv, user).Scan(&r.Members, &member)
		if err == pgx.ErrNoRows || (err == nil && !member) {
			return ErrNotMember
		}
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT m.user_id, coalesce(rp.read_seq, 0)
			FROM membership_periods m
			JOIN users u ON u.user_id = m.user_id
			LEFT JOIN read_positions rp ON rp.user_id = m.user_id AND rp.conv_id = m.conv_id
			WHERE m.conv_id = $1 AND m.to_seq IS NULL AND NOT u.receipts_private
			ORDER BY m.user_id`, conv)
		if err != nil {
			return err
		}
		r.Reads, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (UserRead, error) {
			var u UserRead
			return u, row.Scan(&u.User, &u.Read)
		})
		return err
	})
	return r, err
}

// SetReceiptsPrivate sets whether user's read positions are hidden from
// other members, and returns the setting.
func (s *Store) SetReceiptsPrivate(ctx context.Context, user string, private bool) (bool, error) {
	err := s.pool.QueryRow(ctx, `UPDATE users SET receipts_private = $2 WHERE user_id = $1 RETURNING receipts_private`, user, private).Scan(&private)
	if err == pgx.ErrNoRows {
		return false, ErrNotFound
	}
	return private, err
}
