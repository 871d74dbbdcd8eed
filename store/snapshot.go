package store

import (
	"context"
	"math"

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
		// One query for every conversation's periods, one for heads, reads
		// and unread counts; events only where there is a gap.
		rows, err := tx.Query(ctx, `SELECT conv_id, from_seq, coalesce(to_seq, $3) FROM membership_periods
			WHERE user_id = $1 AND conv_id = ANY($2) ORDER BY conv_id, from_seq`, user, convs, int64(math.MaxInt64))
		if err != nil {
			return err
		}
		periods := map[string][]Period{}
		for rows.Next() {
			var conv string
			var p Period
			if err := rows.Scan(&conv, &p.From, &p.To); err != nil {
				rows.Close()
				return err
			}
			periods[conv] = append(periods[conv], p)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT c.i, h.head, r.read, parley_unread(c.conv, $1, r.read)
			FROM unnest($2::text[]) WITH ORDINALITY AS c(conv, i)
			CROSS JOIN LATERAL (SELECT coalesce(max(seq), 0) AS head FROM events WHERE conv_id = c.conv) h
			CROSS JOIN LATERAL (SELECT coalesce((SELECT read_seq FROM read_positions WHERE user_id = $1 AND conv_id = c.conv), 0) AS read) r
			WHERE EXISTS (SELECT 1 FROM membership_periods m WHERE m.user_id = $1 AND m.conv_id = c.conv)`, user, convs)
		if err != nil {
			return err
		}
		for rows.Next() {
			var i int64
			var head, read, unread int64
			if err := rows.Scan(&i, &head, &read, &unread); err != nil {
				rows.Close()
				return err
			}
			out[i-1].Head, out[i-1].Read, out[i-1].Unread = head, read, unread
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		// Every row of every small gap, in one query: at most fullMax each.
		var fc []string
		var fa, fh, fi []int64
		for i, conv := range convs {
			if gap := out[i].Head - afters[i]; len(periods[conv]) > 0 && afters[i] >= 0 && gap > 0 && gap <= int64(fullMax) {
				fc, fa, fh, fi = append(fc, conv), append(fa, afters[i]), append(fh, out[i].Head), append(fi, int64(i))
			}
		}
		full := map[int64][]Event{}
		if len(fc) > 0 {
			rows, err := tx.Query(ctx, `SELECT u.i, e.seq, e.kind, e.sender, coalesce(e.cmid, ''), coalesce(e.body, ''::bytea), e.ts,
					e.recalled_by IS NOT NULL, coalesce(e.target, 0), e.users
				FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) AS u(conv, after, head, i)
				JOIN events e ON e.conv_id = u.conv AND e.seq > u.after AND e.seq <= u.head
				ORDER BY u.i, e.seq`, fc, fa, fh, fi)
			if err != nil {
				return err
			}
			for rows.Next() {
				var i int64
				var e Event
				if err := rows.Scan(&i, &e.Seq, &e.Kind, &e.Sender, &e.Cmid, &e.Body, &e.Ts, &e.Recalled, &e.Target, &e.Users); err != nil {
					rows.Close()
					return err
				}
				e.Conv = convs[i]
				full[i] = append(full[i], e)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
		}
		for i, conv := range convs {
			it := &out[i]
			it.Conv = conv
			ps := periods[conv]
			if len(ps) == 0 {
				*it = SnapshotItem{Conv: conv, Err: ErrNotMember}
				continue
			}
			after := afters[i]
			gap := it.Head - after
			switch {
			case after < 0 || gap < 0:
				it.Err = ErrCursorAhead
			case gap == 0:
			case gap <= int64(fullMax):
				it.Events = visibleRun(after, ps, full[int64(i)])
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

// visibleRun returns the visible events of rows (seq order, all rows of a
// range starting at after+1) up to the first seq without a row, as sync
// would: a seq in flight ends the run.
func visibleRun(after int64, ps []Period, rows []Event) []Event {
	var out []Event
	next := after + 1
	for _, e := range rows {
		if e.Seq != next {
			break
		}
		next++
		if e.Kind == KindHole || !inPeriods(ps, e.Seq) {
			continue
		}
		if e.Recalled {
			e.Body = nil
		}
		out = append(out, e)
	}
	return out
}

func inPeriods(ps []Period, seq int64) bool {
	for _, p := range ps {
		if seq >= p.From && seq <= p.To {
			return true
		}
	}
	return false
}
