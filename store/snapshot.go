package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// SnapshotItem is one conversation of a snapshot reply.
type SnapshotItem struct {
	Conv    string
	Head    int64
	Read    int64
	Unread  int64
	Events  []Event
	Skipped int64
	Err     error // ErrNotMember, ErrCursorAhead
}

// Snapshot is the batched login pull (seed 003): for each (conv, after),
// from one REPEATABLE READ snapshot, with gap = head - after: nothing if
// the gap is 0; every visible event after `after` if the gap is at most
// fullMax; otherwise the newest tail visible events and how many visible
// events were skipped.
func (s *Store) Snapshot(ctx context.Context, user string, convs []string, afters []int64, fullMax, tail int) ([]SnapshotItem, error) {
	out := make([]SnapshotItem, len(convs))
	err := s.readTx(ctx, func(tx pgx.Tx) error {
		for i, conv := range convs {
			it := &out[i]
			it.Conv = conv
			periods, err := periodsTx(ctx, tx, conv, user)
			if errors.Is(err, ErrNotMember) {
				it.Err = err
				continue
			}
			if err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, `SELECT coalesce(max(seq), 0),
					coalesce((SELECT read_seq FROM read_positions WHERE user_id = $2 AND conv_id = $1), 0)
				FROM events WHERE conv_id = $1`, conv, user).Scan(&it.Head, &it.Read); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, unreadSQL, user, conv, it.Read).Scan(&it.Unread); err != nil {
				return err
			}
			after := afters[i]
			gap := it.Head - after
			switch {
			case after < 0 || gap < 0:
				it.Err = ErrCursorAhead
			case gap == 0:
			case gap <= int64(fullMax):
				p := Page{Head: it.Head, Upto: after}
				if err := readRanges(ctx, tx, conv, periods, fullMax, &p); err != nil {
					return err
				}
				it.Events = p.Events
			default:
				if err := snapshotTail(ctx, tx, conv, user, after, tail, it); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return out, err
}

// snapshotTail fills the newest tail visible events after `after`, and
// how many visible events above `after` it left out.
func snapshotTail(ctx context.Context, tx pgx.Tx, conv, user string, after int64, tail int, it *SnapshotItem) error {
	const visible = `e.conv_id = $1 AND e.seq > $2 AND e.kind <> 0
		AND EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = e.conv_id AND m.user_id = $3
		            AND e.seq >= m.from_seq AND (m.to_seq IS NULL OR e.seq <= m.to_seq))`
	var total int64
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM events e WHERE `+visible, conv, after, user).Scan(&total); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `SELECT e.seq, e.kind, e.sender, coalesce(e.cmid, ''), coalesce(e.body, ''::bytea), e.ts,
			e.recalled_by IS NOT NULL, coalesce(e.target, 0), e.users
		FROM events e WHERE `+visible+` ORDER BY e.seq DESC LIMIT $4`, conv, after, user, tail)
	if err != nil {
		return err
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		e := Event{Conv: conv}
		err := r.Scan(&e.Seq, &e.Kind, &e.Sender, &e.Cmid, &e.Body, &e.Ts, &e.Recalled, &e.Target, &e.Users)
		if e.Recalled {
			e.Body = nil
		}
		return e, err
	})
	if err != nil {
		return err
	}
	for l, r := 0, len(evs)-1; l < r; l, r = l+1, r-1 {
		evs[l], evs[r] = evs[r], evs[l]
	}
	it.Events = evs
	it.Skipped = total - int64(len(evs))
	return nil
}
