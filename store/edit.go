package store

import (
	"bytes"
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// ErrEditWindow: the message is older than the edit window.
var ErrEditWindow = errors.New("store: the edit window has passed")

// EditResult is the edit event's seq and its target.
type EditResult struct {
	Seq    int64
	Target int64
	Again  bool // the message's newest edit has this body already: Seq is that edit's
	// Members is the conversation's member count (for fan-out's tier).
	Members int64
}

// Edit appends an edit event (kind 5: ch.Actor, target, body) and makes
// message target read with body and edited = ch.Ts, in one transaction
// ordered with the conversation's sends, membership changes and recalls
// (it holds the conversation's change lock, and allocates its seq only
// once the edit was checked). Only the sender (ch.Actor, a current
// member) may edit, within window milliseconds of the message's ts:
// ErrNoMessage (no msg at target, or it was recalled), ErrNotSender,
// ErrEditWindow, ErrNotMember (also for an unknown conversation),
// ErrForbidden (MutedErr: the editor is muted). An edit
// with the body of the message's newest edit is a retry: it returns that
// edit (Again) without a new seq.
func (s *Store) Edit(ctx context.Context, ch *MembershipChange, target int64, body []byte, windowMs int64) (EditResult, error) {
	r := EditResult{Target: target}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		actor, err := lockActor(ctx, tx, ch)
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				return ErrNotMember // no such conversation: nobody is a member
			}
			return err
		}
		if actor.mutedUntil > ch.Ts {
			return MutedErr(actor.mutedUntil)
		}
		var key int64
		if err := tx.QueryRow(ctx, `SELECT conv_key, member_count FROM conversations WHERE conv_id = $1`, ch.Conv).Scan(&key, &r.Members); err != nil {
			return err
		}
		var sender string
		var ts int64
		var recalledBy, editedBy *int64
		var cur []byte
		err = tx.QueryRow(ctx, `SELECT sender, ts, recalled_by, edited_by, coalesce(body, ''::bytea) FROM events
			WHERE conv_key = $1 AND seq = $2 AND kind = 1 FOR UPDATE`,
			key, target).Scan(&sender, &ts, &recalledBy, &editedBy, &cur)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return ErrNoMessage
		case err != nil:
			return err
		case recalledBy != nil:
			return ErrNoMessage
		case sender != ch.Actor:
			return ErrNotSender
		case editedBy != nil && bytes.Equal(cur, body):
			r.Seq, r.Again = *editedBy, true
			return nil
		case ch.Ts-ts > windowMs:
			return ErrEditWindow
		}
		if err := allocate(ctx, tx, ch); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `INSERT INTO events (conv_key, seq, kind, sender, ts, target, body) VALUES ($1, $2, $6, $3, $4, $5, $7) ON CONFLICT DO NOTHING`,
			key, ch.Seq, ch.Actor, ch.Ts, target, KindEdit, body)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrSeqTaken
		}
		r.Seq = ch.Seq
		_, err = tx.Exec(ctx, `UPDATE events SET body = $3, edited_ts = $4, edited_by = $5 WHERE conv_key = $1 AND seq = $2`,
			key, target, body, ch.Ts, ch.Seq)
		return err
	})
	return r, err
}
