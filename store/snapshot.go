package store

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SnapshotItem is one conversation of a snapshot reply.
type SnapshotItem struct {
	Conv    string
	Head    int64
	Read    int64
	Unread  int64
	Events  []Event // read-only: items of one batch may share events
	Skipped int64
	Err     error // ErrNotMember, ErrCursorAhead
}

// SnapshotQuery is one snapshot request: a user's (conv, after) pairs.
type SnapshotQuery struct {
	User   string
	Convs  []string
	Afters []int64
}

// Snapshot is the batched login pull (docs/protocol.md §4 snapshot): for each
// (conv, after), with gap = head - after: nothing if the gap is 0; every
// visible event after `after` if the gap is at most fullMax; otherwise the
// newest tail visible events and how many visible events were skipped. Every
// item comes from one consistent snapshot of the database.
func (s *Store) Snapshot(ctx context.Context, user string, convs []string, afters []int64, fullMax, tail int) ([]SnapshotItem, error) {
	out, err := s.SnapshotBatch(ctx, []SnapshotQuery{{User: user, Convs: convs, Afters: afters}}, fullMax, tail)
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// snapshotSQL answers every item of a batch of snapshot requests (of any
// users) in ONE statement: every item comes from one consistent snapshot
// of the database, in one round trip. Work that several items share is
// done once: a conversation's head, a (user, conversation)'s periods,
// read position and unread count, and the rows of a range of events.
// Row kinds (column t):
//
//	0: one per item whose user is or was a member: k (the item's position
//	   in the arrays, from 1), head, read, unread (-1: count it from the
//	   item's rows of kind 1, which hold every event above read), the
//	   visible events above `after` when the gap is larger than fullMax
//	   (total), and the user's periods (froms, tos);
//	1: every row of a small gap (st, head] of conv (with head), once per distinct
//	   (conv, st) whoever asked for it: the members of a conversation
//	   reconnecting together ask for the same range. st is the item's
//	   after, or its read position when that is lower and the unread
//	   count is counted in these rows (unread -1). The caller applies
//	   each user's periods (visibleRun);
//	2: per item with a large gap, the newest tail events visible to the
//	   item's user.
const snapshotSQL = `WITH q AS (
	SELECT k, usr, conv, after FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY AS q(usr, conv, after, k)
), hd AS MATERIALIZED ( -- once per conversation (not per reference to head)
	SELECT d.conv, c.conv_key AS key, coalesce(c.dense_seq, 0) AS w,
		(SELECT coalesce(max(e.seq), 0) FROM events e WHERE e.conv_key = c.conv_key) AS head
	FROM (SELECT DISTINCT conv FROM q) d JOIN conversations c ON c.conv_id = d.conv
), uc AS MATERIALIZED (
	SELECT u.usr, u.conv, hd.key, hd.head, p.froms, p.tos, r.read, r.cleared,
		CASE WHEN cv.counted THEN -1 ELSE ur.unread END AS unread
	FROM (SELECT usr, conv, min(after) AS lo, max(after) AS hi FROM q GROUP BY usr, conv) u
	JOIN hd ON hd.conv = u.conv
	CROSS JOIN LATERAL (SELECT coalesce(max(r.read_seq), 0) AS read, coalesce(max(r.cleared_seq), 0) AS cleared
		FROM read_positions r WHERE r.user_id = u.usr AND r.conv_id = u.conv) r
	-- periods as the user sees them: nothing at or below the cleared
	-- position (a period wholly below it gets from > to: it holds nothing)
	CROSS JOIN LATERAL (SELECT array_agg(greatest(m.from_seq, r.cleared + 1) ORDER BY m.from_seq) AS froms,
			array_agg(coalesce(m.to_seq, 9223372036854775807) ORDER BY m.from_seq) AS tos
		FROM membership_periods m WHERE m.user_id = u.usr AND m.conv_id = u.conv) p
	-- counted: the caller counts the unread messages (unreadIn) in the
	-- rows this statement returns for each of the user's items of the
	-- conversation, which then start at or below the read position
	-- (read or after, whichever is lower): a small gap, and at most $6
	-- rows below after that the reply does not need otherwise
	CROSS JOIN LATERAL (SELECT u.lo >= 0 AND r.read >= r.cleared AND u.hi - r.read <= $6
			AND hd.head - least(u.lo, r.read) <= $4 AS counted) cv
	-- otherwise the unread count, from the conversation's row and head
	-- read above (when counted, of no conversation: a lookup by NULL
	-- reads no index page, and the count is 0)
	CROSS JOIN LATERAL parley_unread_at(CASE WHEN NOT cv.counted THEN u.conv END, u.usr, r.read,
		hd.key, hd.head, hd.w) ur
	WHERE p.froms IS NOT NULL
), it AS MATERIALIZED (
	SELECT q.k, q.usr, q.conv, uc.key, q.after, uc.head, uc.read, uc.cleared, uc.unread, uc.froms, uc.tos,
		CASE WHEN uc.unread < 0 THEN least(q.after, uc.read) ELSE q.after END AS st -- where the item's rows start
	FROM q JOIN uc ON uc.usr = q.usr AND uc.conv = q.conv
), rg AS (
	SELECT DISTINCT conv, key, st, head FROM it WHERE st >= 0 AND head > st AND head - st <= $4
)
SELECT 0 AS t, it.k, '' AS conv, 0::bigint AS after, it.head, it.read, it.unread,
	CASE WHEN it.after >= 0 AND it.head - it.after > $4 THEN
		(SELECT count(*) FROM events e WHERE e.conv_key = it.key AND e.seq > greatest(it.after, it.cleared) AND e.kind <> 0
			AND EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = it.conv AND m.user_id = it.usr
				AND e.seq >= m.from_seq AND (m.to_seq IS NULL OR e.seq <= m.to_seq)))
	ELSE 0 END AS total,
	it.froms, it.tos, ` + noEventColumns + `
FROM it
UNION ALL
SELECT 1, 0, rg.conv, rg.st, rg.head, 0, 0, 0, NULL, NULL, ` + eventColumns + `
FROM rg JOIN events e ON e.conv_key = rg.key AND e.seq > rg.st AND e.seq <= rg.head
UNION ALL
SELECT 2, it.k, '', 0, 0, 0, 0, 0, NULL, NULL, tl.*
FROM it CROSS JOIN LATERAL (
	SELECT ` + eventColumns + `
	FROM events e WHERE e.conv_key = it.key AND e.seq > greatest(it.after, it.cleared) AND e.kind <> 0
		AND EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = it.conv AND m.user_id = it.usr
			AND e.seq >= m.from_seq AND (m.to_seq IS NULL OR e.seq <= m.to_seq))
	ORDER BY e.seq DESC LIMIT $5) tl
WHERE it.after >= 0 AND it.head - it.after > $4`

// SnapshotBatch answers several snapshot requests, of any users, with one
// statement (one round trip): each request's items as Snapshot returns
// them, all from one consistent snapshot of the database. What identical
// items of different requests share (a conversation's head, the rows of
// the same range of events) is read once; visibility stays per user.
//
// A conversation id that cannot be stored (not UTF-8, or with a NUL byte)
// is answered ErrNotMember without asking PostgreSQL, so no request can
// make the statement fail for the others.
func (s *Store) SnapshotBatch(ctx context.Context, qs []SnapshotQuery, fullMax, tail int) ([][]SnapshotItem, error) {
	var users, convs []string
	var afters []int64
	type ref struct{ q, i int } // the batch's item k (from 1) is qs[q].Convs[i]
	var refs []ref
	for qi, q := range qs {
		for i, conv := range q.Convs {
			if !storable(conv) || !storable(q.User) {
				continue
			}
			users, convs, afters = append(users, q.User), append(convs, conv), append(afters, q.Afters[i])
			refs = append(refs, ref{qi, i})
		}
	}
	type item struct {
		SnapshotItem
		member bool
		ps     []Period
		tail   []Event
	}
	items := make([]item, len(refs))
	ranges := map[rangeKey][]Event{}
	if len(refs) > 0 {
		if err := s.snapshotRows(ctx, users, convs, afters, fullMax, tail, func(t, k int64, key rangeKey, hdr SnapshotItem, froms, tos []int64, e Event) {
			switch t {
			case 0:
				it := &items[k-1]
				it.member, it.SnapshotItem = true, hdr
				it.ps = make([]Period, len(froms))
				for j := range froms {
					it.ps[j] = Period{From: froms[j], To: tos[j]}
				}
			case 1:
				e.Conv = key.conv
				r, ok := ranges[key]
				if !ok { // the row carries its range's head: the range's size
					r = make([]Event, 0, min(hdr.Head-key.after, int64(fullMax+snapshotCountBelow)))
				}
				ranges[key] = append(r, e)
			case 2:
				e.Conv = convs[k-1]
				items[k-1].tail = append(items[k-1].tail, e)
			}
		}); err != nil {
			return nil, err
		}
	}
	bySeq := func(a, b Event) int { return cmp.Compare(a.Seq, b.Seq) }
	for _, evs := range ranges {
		slices.SortFunc(evs, bySeq)
	}
	out := make([][]SnapshotItem, len(qs))
	for qi, q := range qs {
		out[qi] = make([]SnapshotItem, len(q.Convs))
		for i, conv := range q.Convs {
			out[qi][i] = SnapshotItem{Conv: conv, Err: ErrNotMember} // unless found below
		}
	}
	for k, r := range refs {
		it := &items[k]
		if !it.member {
			continue
		}
		conv, after := convs[k], afters[k]
		res := &out[r.q][r.i]
		*res = SnapshotItem{Conv: conv, Head: it.Head, Read: it.Read, Unread: it.Unread}
		var rows []Event // the item's rows of kind 1: from after, or from read if lower and counted
		if it.Unread < 0 {
			rows = ranges[rangeKey{conv, min(after, it.Read)}]
			res.Unread = unreadIn(qs[r.q].User, it.Read, it.ps, rows)
		} else {
			rows = ranges[rangeKey{conv, after}]
		}
		switch gap := it.Head - after; {
		case after < 0 || gap < 0:
			*res = SnapshotItem{Conv: conv, Err: ErrCursorAhead}
		case gap == 0:
		case gap <= int64(fullMax):
			res.Events = visibleRun(after, it.ps, rows)
		default:
			slices.SortFunc(it.tail, bySeq)
			res.Events = it.tail
			res.Skipped = it.Skipped - int64(len(it.tail))
		}
	}
	return out, nil
}

// snapshotCountBelow is the most rows below an item's after (down to its
// read position) that a snapshot statement returns so that the unread
// count is counted in them rather than by parley_unread_at's index
// lookups (the cheaper for a few rows).
const snapshotCountBelow = 16

// rangeKey names the rows (after, head] of conv (head is the
// conversation's, the same for every item of one statement).
type rangeKey struct {
	conv  string
	after int64
}

// PlanSnapshots has every connection of the snapshot pool plan
// snapshotSQL (with the generic plan, as snapshotRows runs it) by running
// it on no items; the plan stays with the connection's prepared
// statement until the connection is replaced or PostgreSQL invalidates it
// (new statistics of a table it reads). Call it once the schema is
// migrated, before serving: a gateway's first snapshots after a start
// are a reconnect storm's, and planning the statement takes PostgreSQL
// long enough on each connection to hold the storm up (BENCHMARKS.md,
// the rows "d05fb79 against 2c63566" and
// "f461d8c against e5328fb + 37cdf11").
func (s *Store) PlanSnapshots(ctx context.Context) error {
	conns := make([]*pgxpool.Conn, 0, snapshotConns)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range snapshotConns { // all at once: each a different connection
		c, err := s.snapshots.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	errs := make(chan error, len(conns))
	for _, c := range conns {
		go func() {
			b, _ := genericBatch("BEGIN READ ONLY", "", nil, snapshotSQL, snapshotArgs([]string{}, []string{}, []int64{}, 0, 0))
			errs <- c.SendBatch(ctx, b).Close()
		}()
	}
	var err error
	for range conns {
		err = errors.Join(err, <-errs)
	}
	// A connection whose batch failed is left in a failed transaction:
	// the pool closes it on release.
	return err
}

// snapshotArgs are snapshotSQL's arguments.
func snapshotArgs(users, convs []string, afters []int64, fullMax, tail int) []any {
	return []any{users, convs, afters, int64(fullMax), int64(tail), int64(snapshotCountBelow)}
}

// snapshotRows runs snapshotSQL and hands each row to f (hdr.Skipped
// carries the row's total), with the generic plan (as genericRows, but on
// the snapshot pool, whose few connections each plan it once): planning
// this statement anew for every execution (what PostgreSQL chooses on its
// own, as its estimates depend on the array lengths) costs more than
// running it.
func (s *Store) snapshotRows(ctx context.Context, users, convs []string, afters []int64, fullMax, tail int,
	f func(t, k int64, key rangeKey, hdr SnapshotItem, froms, tos []int64, e Event)) error {
	// The scan targets are the statement's, not the row's: their addresses
	// escape into Scan, and declared per row they were allocated anew for
	// every row, of which a reconnect storm's statements return many
	// (BENCHMARKS.md, the row "37cdf11 against 0b5929c"). Each row starts
	// from zero values, so nothing of one row (a body, an array Scan
	// could reuse) reaches the next; f gets copies.
	var (
		t, k       int64
		key        rangeKey
		hdr        SnapshotItem
		froms, tos []int64
		ev         eventScan          // the row's event: eventColumns
		conv       pgtype.DriverBytes // valid until the next row
		lastConv   string
	)
	dest := append([]any{&t, &k, &conv, &key.after, &hdr.Head, &hdr.Read, &hdr.Unread, &hdr.Skipped, &froms, &tos}, ev.dest()...)
	return s.batchRows(ctx, s.snapshots, "BEGIN READ ONLY", "", nil, snapshotSQL, snapshotArgs(users, convs, afters, fullMax, tail), func(rows pgx.Rows) error {
		t, k, key, hdr, froms, tos = 0, 0, rangeKey{}, SnapshotItem{}, nil, nil
		ev.reset()
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		// A range's rows come one after another, all naming its
		// conversation: its string is made once per range, not per row.
		if string(conv) != lastConv {
			lastConv = string(conv)
		}
		key.conv = lastConv
		e, err := ev.event("")
		if err != nil {
			return err
		}
		f(t, k, key, hdr, froms, tos, e)
		return nil
	})
}

// genericRows runs sql, a read, with PostgreSQL's generic plan, and calls
// scan for each row (an error it returns ends the call). The statement
// runs in a read-only transaction that sets plan_cache_mode to
// force_generic_plan, pipelined with it in one round trip. PostgreSQL
// plans a prepared lookup by an array of ids anew on every execution
// while its custom plan looks cheaper than the generic one, which for a
// short array it always does: in a reconnect storm the device lookup
// was planned anew on most of its calls, and planning cost about as much
// as executing (BENCHMARKS.md, the row "45fa4d4 against acf5b32"). sql
// must be written so that no plan but index lookups per array element
// makes sense (LATERAL subqueries with LIMIT, scalar subqueries): a
// generic plan is made once per connection, maybe while the tables are
// small, and kept as they grow.
func (s *Store) genericRows(ctx context.Context, sql string, args []any, scan func(pgx.Rows) error) error {
	return s.batchRows(ctx, s.pool, "BEGIN READ ONLY", "", nil, sql, args, scan)
}

// storable reports whether s can be a text value in PostgreSQL (UTF-8
// without NUL): an id that is not was never stored.
func storable(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// visibleRun returns the visible events of rows above after (seq order,
// all rows of a range starting at or below after+1, recalled ones without
// their body) up to the first seq without a row, as sync would: a seq in
// flight ends the run. When every event of the run is visible (the
// common case: a member since before after, no holes) it is a slice of
// rows itself, shared with the other items of the range: items' events
// are read-only.
func visibleRun(after int64, ps []Period, rows []Event) []Event {
	start := 0
	for start < len(rows) && rows[start].Seq <= after { // rows below after, for the unread count
		start++
	}
	run, n, all := rows[start:], 0, true
	for next := after + 1; n < len(run) && run[n].Seq == next; next++ {
		all = all && run[n].Kind != KindHole && inPeriods(ps, run[n].Seq)
		n++
	}
	if n == 0 {
		return nil
	}
	if all {
		return run[:n:n]
	}
	var out []Event
	for _, e := range run[:n] {
		if e.Kind != KindHole && inPeriods(ps, e.Seq) {
			if out == nil {
				out = make([]Event, 0, n)
			}
			out = append(out, e)
		}
	}
	return out
}

// unreadIn is the unread count by its definition (docs/consistency.md)
// over rows, the events of a range that holds every seq above read (as
// snapshotSQL's rows of kind 1 do for an item whose gap is small and
// starts at or below read): the messages above read, in the user's
// periods (ps, which start above the cleared position, at or below
// read), neither recalled nor sent by the user. Counting the rows the
// snapshot returns anyway spares PostgreSQL the index lookups of
// parley_unread_at for every such item: most of a reconnect storm's.
func unreadIn(user string, read int64, ps []Period, rows []Event) int64 {
	var n int64
	for _, e := range rows {
		if e.Seq > read && e.Kind == KindMsg && !e.Recalled && e.Sender != user && inPeriods(ps, e.Seq) {
			n++
		}
	}
	return n
}

func inPeriods(ps []Period, seq int64) bool {
	for _, p := range ps {
		if seq >= p.From && seq <= p.To {
			return true
		}
	}
	return false
}
