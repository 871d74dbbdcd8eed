package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// Errors of Recall.
var (
	ErrNoMessage    = errors.New("store: no such message")
	ErrNotSender    = errors.New("store: only the sender may recall a message")
	ErrRecallWindow = errors.New("store: the recall window has passed")
)

// RecallResult is the recall event's seq and its target.
type RecallResult struct {
	Seq    int64
	Target int64
	Again  bool // the target was recalled before: Seq is that first recall's
	// Members is the conversation's member count (for fan-out's tier).
	Members int64
}

// Recall appends a recall event for message target, marks the target
// recalled and empties its body, in one transaction ordered with the
// conversation's sends (MembershipChange). The sender (ch.Actor, a
// current member) may recall within window milliseconds of the message's
// ts; in a group, its owner and admins may recall anyone's message at any
// time: ErrNoMessage, ErrNotSender, ErrRecallWindow, ErrNotMember (also
// for an unknown conversation). Recalling a recalled message returns the
// first recall (Again), without a new seq.
func (s *Store) Recall(ctx context.Context, ch *MembershipChange, target, windowMs int64) (RecallResult, error) {
	r := RecallResult{Target: target}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		actor, err := lockActor(ctx, tx, ch)
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				return ErrNotMember // no such conversation: nobody is a member
			}
			return err
		}
		// The conversation row is locked too: AdvanceDense, which counts
		// own messages into own_msg_buckets as dense_seq passes them, is
		// ordered before or after this recall (see AdvanceDense).
		var dense, key int64
		var kind string
		if err := tx.QueryRow(ctx, `SELECT dense_seq, member_count, conv_key, kind FROM conversations WHERE conv_id = $1 FOR UPDATE`, ch.Conv).Scan(&dense, &r.Members, &key, &kind); err != nil {
			return err
		}
		var sender string
		var ts int64
		var recalledBy *int64
		err = tx.QueryRow(ctx, `SELECT sender, ts, recalled_by FROM events WHERE conv_key = $1 AND seq = $2 AND kind = 1 FOR UPDATE`,
			key, target).Scan(&sender, &ts, &recalledBy)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return ErrNoMessage
		case err != nil:
			return err
		}
		moderator := false
		if sender != ch.Actor {
			// Someone else's message: only a group's owner and admins.
			if kind != "group" || actor.role < RoleAdmin {
				return ErrNotSender
			}
			moderator = true
		}
		switch {
		case recalledBy != nil:
			r.Seq, r.Again = *recalledBy, true
			return nil
		case !moderator && ch.Ts-ts > windowMs:
			return ErrRecallWindow
		}
		if err := allocate(ctx, tx, ch); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `INSERT INTO events (conv_key, seq, kind, sender, ts, target) VALUES ($1, $2, 4, $3, $4, $5) ON CONFLICT DO NOTHING`,
			key, ch.Seq, ch.Actor, ch.Ts, target)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrSeqTaken
		}
		r.Seq = ch.Seq
		if _, err = tx.Exec(ctx, `UPDATE events SET recalled_by = $3, body = NULL WHERE conv_key = $1 AND seq = $2`, key, target, ch.Seq); err != nil {
			return err
		}
		// Its edits (kind 5, above it) lose their bodies too.
		if _, err = tx.Exec(ctx, `UPDATE events SET body = NULL WHERE conv_key = $1 AND seq > $2 AND kind = 5 AND target = $2 AND body IS NOT NULL`,
			key, target); err != nil {
			return err
		}
		if target <= dense {
			if _, err = tx.Exec(ctx, `UPDATE own_msg_buckets SET n = n - 1
				WHERE conv_id = $1 AND sender = $2 AND bucket = $3::bigint >> (SELECT bucket_bits FROM unread_settings)`,
				ch.Conv, sender, target); err != nil {
				return err
			}
		}
		return nil
	})
	return r, err
}
