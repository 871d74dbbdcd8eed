package store

import (
	"cmp"
	"context"
	"math"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

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
	Cleared   int64 // the user's "delete for me" position (0: none)
	Unread    int64
	LastTs    int64
	// MutedUntil is the user's muted_until (Unix ms; 0: never muted).
	MutedUntil int64
}

// ConvListPosition is a position in a user's conversation list: items
// strictly after (LastTs, Conv) in (LastTs desc, Conv asc) order. The
// convs request carries it as its opaque `cursor` (docs/protocol.md); it
// is not a delivery cursor (package cursor).
type ConvListPosition struct {
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

// ConvPage is one page of a user's conversation list.
type ConvPage struct {
	Items []ConvItem
	// More is true if items follow; Next is then the cursor of the
	// following page.
	More bool
	Next *ConvListPosition
	// Backfill holds the rows of push-tier conversations that had to be
	// probed (missing from ConvOrder.Rows) or that were behind their log,
	// for the caller to write.
	Backfill map[string]int64
}

// Conversations lists every conversation user is or was a member of,
// newest visible activity first, from one REPEATABLE READ snapshot, at
// most limit items after cur (nil: from the top).
//
// The page is chosen in row order; each item's last_ts, like everything
// else in it, is read from the log in the same snapshot, and the page is
// listed by it (a row that lags a commit by the fan-out delay can only
// misplace its conversation across a page boundary, never show a
// last_ts older than its head).
func (s *Store) Conversations(ctx context.Context, user, device string, limit int, cur *ConvListPosition, order ConvOrder) (ConvPage, error) {
	var p ConvPage
	err := s.readTx(ctx, func(tx pgx.Tx) error {
		p = ConvPage{}
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
				JOIN conversations c ON c.conv_id = k.conv
				CROSS JOIN LATERAL (SELECT e.ts FROM events e
				                     WHERE e.conv_key = c.conv_key AND e.seq <= k.last_to AND e.kind <> 0
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
					if p.Backfill == nil {
						p.Backfill = map[string]int64{}
					}
					p.Backfill[c.id] = c.lastTs
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
			all, p.More = all[:limit], true
			last := all[len(all)-1]
			p.Next = &ConvListPosition{LastTs: last.lastTs, Conv: last.id}
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
		p.Items, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ConvItem, error) {
			var it ConvItem
			err := r.Scan(&it.Conv, &it.Kind, &it.Title, &it.Members, &it.Epoch, &it.MinSeq, &it.Head,
				&it.Delivered, &it.Read, &it.Cleared, &it.LastTs, &it.Unread, &it.MutedUntil)
			return it, err
		})
		if err != nil {
			return err
		}
		for _, it := range p.Items {
			if small[it.Conv] && it.LastTs > score[it.Conv] {
				if p.Backfill == nil {
					p.Backfill = map[string]int64{}
				}
				p.Backfill[it.Conv] = it.LastTs
			}
		}
		slices.SortStableFunc(p.Items, func(a, b ConvItem) int {
			if a.LastTs != b.LastTs {
				return cmp.Compare(b.LastTs, a.LastTs)
			}
			return strings.Compare(a.Conv, b.Conv)
		})
		return nil
	})
	return p, err
}

// conversationsSQL: $1 user, $2 device, ($3, $4) the page's conversations
// and the end of the user's last period in each. last_ts is the ts of the
// newest non-hole event at or below that end: that event is visible, since
// the last period starts with the user's own join. The unread count takes the
// conversation's row and head read here (parley_unread_at).
const conversationsSQL = `
SELECT p.conv_id, c.kind, c.title, c.member_count, c.epoch, c.min_seq,
       h.head,
       coalesce(dc.delivered_seq, 0), coalesce(rp.read_seq, 0), coalesce(rp.cleared_seq, 0),
       coalesce((SELECT e.ts FROM events e WHERE e.conv_key = c.conv_key AND e.seq <= p.last_to AND e.kind <> 0
                  ORDER BY e.seq DESC LIMIT 1), 0),
       u.unread, coalesce(cs.muted_until, 0)
  FROM unnest($3::text[], $4::bigint[]) WITH ORDINALITY AS p(conv_id, last_to, i)
  JOIN conversations c ON c.conv_id = p.conv_id
  CROSS JOIN LATERAL (SELECT coalesce(max(e.seq), 0) AS head FROM events e WHERE e.conv_key = c.conv_key) h
  LEFT JOIN device_cursors dc ON dc.device_id = $2 AND dc.conv_id = p.conv_id
  LEFT JOIN read_positions rp ON rp.user_id = $1 AND rp.conv_id = p.conv_id
  LEFT JOIN conv_settings cs ON cs.user_id = $1 AND cs.conv_id = p.conv_id
  CROSS JOIN LATERAL parley_unread_at(p.conv_id, $1, coalesce(rp.read_seq, 0), c.conv_key, h.head, coalesce(c.dense_seq, 0)) u
 ORDER BY p.i`
