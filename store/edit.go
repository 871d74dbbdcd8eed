package store

import (
	"bytes"
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
// ordered with the conversation's membership changes and recalls (it
// holds the conversation's change lock shared, as send batches do, so
// neither waits for the other) and with the message's other edits (it
// locks the message's row, and allocates its seq only then, once the
// edit was checked: of two edits of one message, the one with the higher
// seq commits last and its body stands). Only the sender (ch.Actor, a current
// member) may edit, within window milliseconds of the message's ts:
// ErrNoMessage (no msg at target, or it was recalled), ErrNotSender,
// ErrEditWindow, ErrNotMember (also for an unknown conversation),
// ErrForbidden (MutedErr: the editor is muted). An edit
// with the body of the message's newest edit is a retry: it returns that
// edit (Again) without a new seq.
//
// The transaction takes two PostgreSQL round trips, with the Redis
// allocation between them: BEGIN, the change lock, the actor's membership
// and the message's row (locked) in one batch; then, once the edit was
// checked and its seq allocated, the event's insert with the message's
// new body and the COMMIT in another. So the locks are held across the
// allocation and one round trip that ends with their release. They must
// be held across the allocation: allocating first and checking after
// would turn every edit refused in between (a recall, a removal, a mute,
// or the same edit retried while in flight) into a hole, and E1 allows a
// refused request none (docs/consistency.md, "Edits and the seq
// allocation", gives the ordering's cost as measured).
func (s *Store) Edit(ctx context.Context, ch *MembershipChange, target int64, body []byte, windowMs int64) (EditResult, error) {
	r := EditResult{Target: target}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return r, err
	}
	defer conn.Release()
	err = edit(ctx, conn, ch, target, body, windowMs, &r)
	if conn.Conn().PgConn().TxStatus() != 'I' {
		// A refusal, a retry (nothing to write) or a failure: end the
		// transaction, and its locks. Best effort: if this fails too,
		// Release closes the connection, which ends it as well.
		_, _ = conn.Exec(ctx, `ROLLBACK`)
	}
	return r, err
}

// edit is Edit on conn, which it leaves in the transaction it began
// unless it committed.
func edit(ctx context.Context, conn *pgxpool.Conn, ch *MembershipChange, target int64, body []byte, windowMs int64, r *EditResult) error {
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	queueLockActor(b, ch, `SELECT pg_advisory_xact_lock_shared($1)`)
	b.Queue(editFactsSQL, ch.Conv, target)
	br := conn.SendBatch(ctx, b)
	var f struct {
		head                 int64
		found                bool
		sender               string
		ts                   int64
		recalledBy, editedBy *int64
		cur                  []byte
	}
	actor, err := func() (member, error) {
		if _, err := br.Exec(); err != nil { // BEGIN
			return member{}, err
		}
		actor, err := readLockActor(br, ch.Actor)
		if err != nil {
			return actor, err
		}
		err = br.QueryRow().Scan(&r.Members, &f.head, &f.found, &f.sender, &f.ts, &f.recalledBy, &f.editedBy, &f.cur)
		return actor, err
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case errors.Is(err, ErrNotFound):
		return ErrNotMember // no such conversation: nobody is a member
	case err != nil:
		return err
	case actor.mutedUntil > ch.Ts:
		return MutedErr(actor.mutedUntil)
	case !f.found || f.recalledBy != nil:
		return ErrNoMessage
	case f.sender != ch.Actor:
		return ErrNotSender
	case f.editedBy != nil && bytes.Equal(f.cur, body):
		r.Seq, r.Again = *f.editedBy, true
		return nil
	case ch.Ts-f.ts > windowMs:
		return ErrEditWindow
	}
	if err := allocateAbove(ctx, ch, f.head); err != nil {
		return err
	}
	b = &pgx.Batch{}
	b.Queue(`WITH ins AS (
			INSERT INTO events (conv_key, seq, kind, sender, ts, target, body)
			SELECT c.conv_key, $2, $6, $3, $4, $5, $7 FROM conversations c WHERE c.conv_id = $1
			ON CONFLICT DO NOTHING RETURNING conv_key)
		UPDATE events e SET body = $7, edited_ts = $4, edited_by = $2
		  FROM ins WHERE e.conv_key = ins.conv_key AND e.seq = $5`,
		ch.Conv, ch.Seq, ch.Actor, ch.Ts, target, KindEdit, body)
	b.Queue(`COMMIT`)
	br = conn.SendBatch(ctx, b)
	tag, err := br.Exec()
	if err == nil {
		_, err = br.Exec() // COMMIT
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return err
	case tag.RowsAffected() == 0: // the insert conflicted (the seq is taken): nothing was written
		return ErrSeqTaken
	}
	r.Seq = ch.Seq
	return nil
}

// editFactsSQL reads what an edit of message $2 in conversation $1 is
// checked against, under the change lock (queued after queueLockActor):
// the member count and head, and the message (locked: a second edit of
// it waits here until this one commits, then reads its body).
const editFactsSQL = `SELECT c.member_count, ` + headSQL + `,
		t.seq IS NOT NULL, coalesce(t.sender, ''), coalesce(t.ts, 0), t.recalled_by, t.edited_by, coalesce(t.body, ''::bytea)
	FROM conversations c
	LEFT JOIN LATERAL (SELECT seq, sender, ts, recalled_by, edited_by, body FROM events
	                   WHERE conv_key = c.conv_key AND seq = $2 AND kind = 1 FOR UPDATE) t ON true
	WHERE c.conv_id = $1`
