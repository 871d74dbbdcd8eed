package store

import (
	"context"
	"errors"
	"sort"

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

const mergeCursorSQL = `
WITH d AS (SELECT 1 FROM devices WHERE device_id = $1 AND install_epoch = $3 FOR SHARE)
INSERT INTO device_cursors (device_id, conv_id, install_epoch, delivered_seq)
SELECT $1, $2, $3, $4
WHERE EXISTS (SELECT 1 FROM d)
  AND EXISTS (SELECT 1 FROM membership_periods WHERE conv_id = $2 AND user_id = $5)
  AND $4 <= (SELECT coalesce(max(seq), 0) FROM events WHERE conv_id = $2)
ON CONFLICT (device_id, conv_id) DO UPDATE
  SET delivered_seq = GREATEST(device_cursors.delivered_seq, EXCLUDED.delivered_seq),
      install_epoch = EXCLUDED.install_epoch
RETURNING delivered_seq`

const diagnoseCursorSQL = `
SELECT coalesce((SELECT install_epoch = $3 FROM devices WHERE device_id = $1), false),
       EXISTS (SELECT 1 FROM membership_periods WHERE conv_id = $2 AND user_id = $4)`

// MergeCursors max-merges delivery cursors in one transaction (group
// commit): a cursor never moves down. An ack whose epoch is not the
// device's current install_epoch changes nothing (M5); the device row is
// locked FOR SHARE so a concurrent reinstall is ordered before or after.
func (s *Store) MergeCursors(ctx context.Context, ups []CursorUpdate) ([]CursorResult, error) {
	// A fixed row order keeps concurrent batches from deadlocking.
	order := make([]int, len(ups))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool {
		x, y := ups[order[a]], ups[order[b]]
		if x.Device != y.Device {
			return x.Device < y.Device
		}
		return x.Conv < y.Conv
	})
	res := make([]CursorResult, len(ups))
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			for _, i := range order {
				u := ups[i]
				b.Queue(mergeCursorSQL, u.Device, u.Conv, u.Epoch, u.Seq, u.User)
			}
			br := tx.SendBatch(ctx, b)
			var refused []int
			for _, i := range order {
				err := br.QueryRow().Scan(&res[i].Delivered)
				if err == pgx.ErrNoRows {
					refused = append(refused, i)
					continue
				}
				if err != nil {
					br.Close()
					return err
				}
			}
			if err := br.Close(); err != nil {
				return err
			}
			for _, i := range refused {
				u := ups[i]
				var epochOK, member bool
				if err := tx.QueryRow(ctx, diagnoseCursorSQL, u.Device, u.Conv, u.Epoch, u.User).Scan(&epochOK, &member); err != nil {
					return err
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
			return nil
		})
		if !isDeadlock(err) {
			break
		}
	}
	return res, err
}

// Cursor returns the device's delivery cursor in conv (0 if none).
func (s *Store) Cursor(ctx context.Context, device, conv string) (int64, error) {
	var v int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce((SELECT delivered_seq FROM device_cursors WHERE device_id = $1 AND conv_id = $2), 0)`,
		device, conv).Scan(&v)
	return v, err
}
