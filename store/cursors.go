package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// CursorUpdate is one ack: device (of user, on install epoch) holds every
// event of conv up to Seq.
type CursorUpdate struct {
	Device string
	User   string
	Conv   string
	Epoch  int64
	Seq    int64
}

// CursorResult is the merged cursor, or why the ack was refused.
type CursorResult struct {
	Delivered int64
	Err       error // nil, ErrStaleInstall, ErrNotMember (never a member), ErrCursorAhead
}

// Errors of MergeCursors' per-item results.
var (
	ErrStaleInstall = errors.New("store: ack from an old install")
	ErrCursorAhead  = errors.New("store: seq above head")
)

// mergeCursorsSQL merges a batch of acks, at most one per (device, conv),
// in one statement: an ack counts only if its epoch is the device's
// current install_epoch (the device row is locked FOR SHARE, so a
// concurrent reinstall is ordered before or after the batch), the user was
// a member of the conversation at some time, and seq <= head. Rows are
// written in (device, conv) order so concurrent batches cannot deadlock.
const mergeCursorsSQL = `
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::bigint[], $5::text[]) AS i(device, conv, epoch, seq, usr)
), ok AS (
    SELECT i.device, i.conv, i.epoch, i.seq
      FROM (SELECT * FROM input ORDER BY device, conv) i
      -- Per row, by index (see insertMessagesSQL); locked in input order.
      CROSS JOIN LATERAL (SELECT 1 FROM devices d WHERE d.device_id = i.device AND d.install_epoch = i.epoch FOR SHARE) d
     WHERE coalesce((SELECT true FROM membership_periods m WHERE m.conv_id = i.conv AND m.user_id = i.usr LIMIT 1), false)
       AND i.seq <= (SELECT coalesce(max(e.seq), 0) FROM events e WHERE e.conv_id = i.conv)
)
INSERT INTO device_cursors (device_id, conv_id, install_epoch, delivered_seq)
SELECT device, conv, epoch, seq FROM ok ORDER BY device, conv
ON CONFLICT (device_id, conv_id) DO UPDATE
  SET delivered_seq = GREATEST(device_cursors.delivered_seq, EXCLUDED.delivered_seq),
      install_epoch = EXCLUDED.install_epoch
RETURNING device_id, conv_id, install_epoch::bigint, delivered_seq`

const diagnoseCursorSQL = `
SELECT coalesce((SELECT install_epoch = $3 FROM devices WHERE device_id = $1), false),
       EXISTS (SELECT 1 FROM membership_periods WHERE conv_id = $2 AND user_id = $4)`

// MergeCursors max-merges delivery cursors (group commit): a cursor never
// moves down. Acks of one batch for the same (device, conv) are merged
// first (the largest wins, and every one of them is answered with the
// merged value). An ack whose epoch is not the device's current
// install_epoch changes nothing (M5).
func (s *Store) MergeCursors(ctx context.Context, ups []CursorUpdate) ([]CursorResult, error) {
	// Keyed by epoch too: of two installs' acks only the current one's
	// passes the epoch check, so the insert never meets a key twice.
	type key struct {
		device, conv string
		epoch        int64
	}
	merged := map[key]int{} // key -> index into uniq
	var uniq []CursorUpdate
	for _, u := range ups {
		k := key{u.Device, u.Conv, u.Epoch}
		if i, ok := merged[k]; ok {
			uniq[i].Seq = max(uniq[i].Seq, u.Seq)
			continue
		}
		merged[k] = len(uniq)
		uniq = append(uniq, u)
	}
	n := len(uniq)
	devices, convs, users := make([]string, n), make([]string, n), make([]string, n)
	epochs, seqs := make([]int32, n), make([]int64, n)
	for i, u := range uniq {
		devices[i], convs[i], epochs[i], seqs[i], users[i] = u.Device, u.Conv, int32(u.Epoch), u.Seq, u.User
	}
	var got map[key]int64
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		got = map[key]int64{}
		var rows pgx.Rows
		rows, err = s.pool.Query(ctx, mergeCursorsSQL, devices, convs, epochs, seqs, users)
		if err == nil {
			for rows.Next() {
				var k key
				var v int64
				if err = rows.Scan(&k.device, &k.conv, &k.epoch, &v); err != nil {
					break
				}
				got[k] = v
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if !isDeadlock(err) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	res := make([]CursorResult, len(ups))
	for i, u := range ups {
		if v, ok := got[key{u.Device, u.Conv, u.Epoch}]; ok {
			res[i].Delivered = v
			continue
		}
		// Refused (rare): say why.
		var epochOK, member bool
		if err := s.pool.QueryRow(ctx, diagnoseCursorSQL, u.Device, u.Conv, u.Epoch, u.User).Scan(&epochOK, &member); err != nil {
			return nil, err
		}
		switch {
		case !epochOK:
			res[i].Err = ErrStaleInstall
		case !member:
			res[i].Err = ErrNotMember
		default:
			res[i].Err = ErrCursorAhead
		}
	}
	return res, nil
}
