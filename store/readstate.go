package store

import (
	"cmp"
	"context"
	"errors"
	"math"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// unreadSQL counts the unread messages of user $1 in conversation $2 above
// read position $3 with the parley_unread function of migration 0004:
// derived from the events on every call, never stored
// (docs/consistency.md, "Unread counts").
const unreadSQL = `SELECT parley_unread($2, $1, $3)`

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
           (SELECT coalesce(max(e.seq), 0) FROM events e WHERE e.conv_id = i.conv) AS head,
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

// ConvItem is one conversation as the convs request shows it to a device.
type ConvItem struct {
	Conv      string
	Kind      string
	Title     string
	Members   int64
	Epoch     int64
	Head      int64
	MinSeq    int64
	Delivered int64
	Read      int64
	Unread    int64
	LastTs    int64
}

// ConvCursor is a position in a user's conversation list: items strictly
// after (LastTs, Conv) in (LastTs desc, Conv asc) order.
type ConvCursor struct {
	LastTs int64
	Conv   string
}

// ConvOrder is what Conversations knows in advance about the order of a
// user's conversations: the user's conversation rows (package fanout),
// conversation id → ts of its newest event the user may see, kept for
// push-tier conversations (fewer than SmallBelow members). Conversations
// without a row, and bigger ones (whose rows are not written per
// message), are ordered by probing their logs.
type ConvOrder struct {
	Rows       map[string]int64
	SmallBelow int64
}

// Conversations lists every conversation user is or was a member of,
// newest visible activity first, from one REPEATABLE READ snapshot, at
// most limit items after cur (nil: from the top). more is true if items
// follow; next is then the cursor of the following page. backfill holds
// the rows of push-tier conversations that had to be probed (missing from
// order.Rows) or that were behind their log, for the caller to write.
//
// The page is chosen in row order; each item's last_ts, like everything
// else in it, is read from the log in the same snapshot, and the page is
// listed by it (a row that lags a commit by the fan-out delay can only
// misplace its conversation across a page boundary, never show a
// last_ts older than its head).
func (s *Store) Conversations(ctx context.Context, user, device string, limit int, cur *ConvCursor, order ConvOrder) (items []ConvItem, more bool, next *ConvCursor, backfill map[string]int64, err error) {
	err = s.readTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT m.conv_id, c.member_count, max(coalesce(m.to_seq, $2))
			FROM membership_periods m JOIN conversations c ON c.conv_id = m.conv_id
			WHERE m.user_id = $1 GROUP BY m.conv_id, c.member_count`, user, int64(math.MaxInt64))
		if err != nil {
			return err
		}
		type conv struct {
			id     string
			lastTs int64
			lastTo int64 // end of the user's last period (max int64: open)
		}
		var all []conv
		var probe []string
		var probeTo []int64
		small := map[string]bool{}
		for rows.Next() {
			var id string
			var members, lastTo int64
			if err := rows.Scan(&id, &members, &lastTo); err != nil {
				rows.Close()
				return err
			}
			if members < order.SmallBelow {
				small[id] = true
				if ts, ok := order.Rows[id]; ok {
					all = append(all, conv{id, ts, lastTo})
					continue
				}
			}
			probe = append(probe, id)
			probeTo = append(probeTo, lastTo)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(probe) > 0 {
			// last_ts is the ts of the newest non-hole event at or below
			// the end of the user's last period: that event is visible,
			// since the last period starts with the user's own join.
			rows, err := tx.Query(ctx, `SELECT k.conv, lv.ts, k.last_to
				FROM unnest($1::text[], $2::bigint[]) AS k(conv, last_to)
				CROSS JOIN LATERAL (SELECT e.ts FROM events e
				                     WHERE e.conv_id = k.conv AND e.seq <= k.last_to AND e.kind <> 0
				                     ORDER BY e.seq DESC LIMIT 1) lv`, probe, probeTo)
			if err != nil {
				return err
			}
			for rows.Next() {
				var c conv
				if err := rows.Scan(&c.id, &c.lastTs, &c.lastTo); err != nil {
					rows.Close()
					return err
				}
				all = append(all, c)
				if small[c.id] {
					if backfill == nil {
						backfill = map[string]int64{}
					}
					backfill[c.id] = c.lastTs
				}
			}
			if err := rows.Err(); err != nil {
				return err
			}
		}
		slices.SortFunc(all, func(a, b conv) int {
			if a.lastTs != b.lastTs {
				return cmp.Compare(b.lastTs, a.lastTs)
			}
			return strings.Compare(a.id, b.id)
		})
		if cur != nil {
			i, _ := slices.BinarySearchFunc(all, conv{id: cur.Conv, lastTs: cur.LastTs}, func(a, t conv) int {
				if a.lastTs != t.lastTs {
					return cmp.Compare(t.lastTs, a.lastTs)
				}
				if a.id <= t.id {
					return -1
				}
				return 1
			})
			all = all[i:]
		}
		if len(all) > limit {
			all, more = all[:limit], true
			last := all[len(all)-1]
			next = &ConvCursor{LastTs: last.lastTs, Conv: last.id}
		}
		if len(all) == 0 {
			return nil
		}
		ids := make([]string, len(all))
		lastTo := make([]int64, len(all))
		score := make(map[string]int64, len(all))
		for i, c := range all {
			ids[i], lastTo[i] = c.id, c.lastTo
			score[c.id] = c.lastTs
		}
		rows, err = tx.Query(ctx, conversationsSQL, user, device, ids, lastTo)
		if err != nil {
			return err
		}
		items, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ConvItem, error) {
			var it ConvItem
			err := r.Scan(&it.Conv, &it.Kind, &it.Title, &it.Members, &it.Epoch, &it.MinSeq, &it.Head,
				&it.Delivered, &it.Read, &it.LastTs, &it.Unread)
			return it, err
		})
		if err != nil {
			return err
		}
		for _, it := range items {
			if small[it.Conv] && it.LastTs > score[it.Conv] {
				if backfill == nil {
					backfill = map[string]int64{}
				}
				backfill[it.Conv] = it.LastTs
			}
		}
		slices.SortStableFunc(items, func(a, b ConvItem) int {
			if a.LastTs != b.LastTs {
				return cmp.Compare(b.LastTs, a.LastTs)
			}
			return strings.Compare(a.Conv, b.Conv)
		})
		return nil
	})
	if err != nil {
		return nil, false, nil, nil, err
	}
	return items, more, next, backfill, nil
}

// conversationsSQL: $1 user, $2 device, ($3, $4) the page's conversations
// and the end of the user's last period in each. last_ts is the ts of the
// newest non-hole event at or below that end: that event is visible, since
// the last period starts with the user's own join.
const conversationsSQL = `
SELECT p.conv_id, c.kind, c.title, c.member_count, c.epoch, c.min_seq,
       (SELECT coalesce(max(seq), 0) FROM events WHERE conv_id = p.conv_id),
       coalesce(dc.delivered_seq, 0), coalesce(rp.read_seq, 0),
       coalesce((SELECT e.ts FROM events e WHERE e.conv_id = p.conv_id AND e.seq <= p.last_to AND e.kind <> 0
                  ORDER BY e.seq DESC LIMIT 1), 0),
       u.unread
  FROM unnest($3::text[], $4::bigint[]) WITH ORDINALITY AS p(conv_id, last_to, i)
  JOIN conversations c ON c.conv_id = p.conv_id
  LEFT JOIN device_cursors dc ON dc.device_id = $2 AND dc.conv_id = p.conv_id
  LEFT JOIN read_positions rp ON rp.user_id = $1 AND rp.conv_id = p.conv_id
  CROSS JOIN LATERAL parley_unread_of(p.conv_id, $1, coalesce(rp.read_seq, 0)) u
 ORDER BY p.i`

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
// conversation's sends (MembershipChange). Only the sender (ch.Actor, a
// current member) may recall, within window milliseconds of the message's
// ts: ErrNoMessage, ErrNotSender, ErrRecallWindow, ErrNotMember (also for
// an unknown conversation). Recalling a recalled message returns the
// first recall (Again), without a new seq.
func (s *Store) Recall(ctx context.Context, ch *MembershipChange, target, windowMs int64) (RecallResult, error) {
	r := RecallResult{Target: target}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := lockConversation(ctx, tx, ch); err != nil {
			if errors.Is(err, ErrNotFound) {
				return ErrNotMember // no such conversation: nobody is a member
			}
			return err
		}
		// The conversation row is locked too: AdvanceDense, which counts
		// own messages into own_msg_buckets as dense_seq passes them, is
		// ordered before or after this recall (see AdvanceDense).
		var dense int64
		if err := tx.QueryRow(ctx, `SELECT dense_seq, member_count FROM conversations WHERE conv_id = $1 FOR UPDATE`, ch.Conv).Scan(&dense, &r.Members); err != nil {
			return err
		}
		var sender string
		var ts int64
		var recalledBy *int64
		err := tx.QueryRow(ctx, `SELECT sender, ts, recalled_by FROM events WHERE conv_id = $1 AND seq = $2 AND kind = 1 FOR UPDATE`,
			ch.Conv, target).Scan(&sender, &ts, &recalledBy)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return ErrNoMessage
		case err != nil:
			return err
		case sender != ch.Actor:
			return ErrNotSender
		case recalledBy != nil:
			r.Seq, r.Again = *recalledBy, true
			return nil
		case ch.Ts-ts > windowMs:
			return ErrRecallWindow
		}
		if err := allocate(ctx, tx, ch); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `INSERT INTO events (conv_id, seq, kind, sender, ts, target) VALUES ($1, $2, 4, $3, $4, $5) ON CONFLICT DO NOTHING`,
			ch.Conv, ch.Seq, ch.Actor, ch.Ts, target)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrSeqTaken
		}
		r.Seq = ch.Seq
		if _, err = tx.Exec(ctx, `UPDATE events SET recalled_by = $3, body = NULL WHERE conv_id = $1 AND seq = $2`, ch.Conv, target, ch.Seq); err != nil {
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

// AdvanceDense raises the dense_seq watermark of each conversation to the
// end of the run of seqs that hold rows, starting from its current value
// (migration 0003), and adds the messages it passes to own_msg_buckets
// (migration 0004). A lower bound is always safe: it only makes unread
// counting read a few more index entries. Called after commits.
//
// The conversation rows are locked first, in id order (so concurrent
// callers cannot deadlock), and the second statement's snapshot is taken
// after that: no recall of these conversations can commit in between, so
// each message is counted in its bucket exactly when the watermark passes
// it, as it is at that moment.
func (s *Store) AdvanceDense(ctx context.Context, convs []string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT 1 FROM conversations WHERE conv_id = ANY($1) ORDER BY conv_id FOR UPDATE`, convs); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
WITH d AS (
    SELECT c.conv_id, c.dense_seq AS d0,
           coalesce((SELECT max(t.seq) FROM (SELECT e.seq, e.seq - row_number() OVER (ORDER BY e.seq) AS k
                                               FROM events e WHERE e.conv_id = c.conv_id AND e.seq > c.dense_seq) t
                      WHERE t.k = c.dense_seq), c.dense_seq) AS d1
      FROM conversations c WHERE c.conv_id = ANY($1)
), counted AS (
    INSERT INTO own_msg_buckets (conv_id, sender, bucket, n)
    SELECT d.conv_id, x.sender, x.bucket, x.n
      FROM d CROSS JOIN unread_settings s
      -- LATERAL: each conversation's new seqs by index; a plain join let
      -- the planner scan every message of the table, growing with it.
      CROSS JOIN LATERAL (SELECT e.sender, e.seq >> s.bucket_bits AS bucket, count(*) AS n
                            FROM events e
                           WHERE e.conv_id = d.conv_id AND e.seq > d.d0 AND e.seq <= d.d1
                             AND e.kind = 1 AND e.recalled_by IS NULL
                           GROUP BY 1, 2) x
     WHERE d.d1 > d.d0
     ORDER BY 1, 2, 3
    ON CONFLICT (conv_id, sender, bucket) DO UPDATE SET n = own_msg_buckets.n + EXCLUDED.n
)
UPDATE conversations c SET dense_seq = d.d1 FROM d WHERE c.conv_id = d.conv_id AND d.d1 > d.d0`, convs)
		return err
	})
}
