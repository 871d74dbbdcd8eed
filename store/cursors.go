package store

import (
	"context"
	"errors"
	"maps"

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
	// Known: the caller knows Seq is committed and the user is or was a
	// member of Conv (the connection was pushed or given that seq), so
	// only the epoch is checked.
	Known bool
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

// Every write of a device's cursors (a merge, a reinstall) holds the
// device's cursor lock, a transaction-level advisory lock (deviceLockKey),
// exclusively. A merge takes its batch's device locks (sorted, so batches
// cannot wait in a cycle) in the statement before mergeCursorsSQL, in one
// transaction: the merge's snapshot, taken after them, sees every cursor of
// its devices as it is, so it writes only the cursors that move, with plain
// UPDATEs and INSERTs. An upsert (INSERT … ON CONFLICT DO UPDATE) and a
// FOR SHARE lock of the device row each wrote a WAL record per row to lock
// it, and rewrote cursors that did not move; these were most of the WAL of
// an ack. A reinstall takes the same lock, so an ack of the old install is
// written before it (and deleted by it) or sees the new install_epoch and
// changes nothing.

// mergeAcksOK picks a batch's acks of the device's current install
// ($1…$5: device, conv, epoch, seq, user). Known acks
// (CursorUpdate.Known: the gateway knows the seq is committed and visible
// to the user) need nothing more; mergeCursorsChecks adds what the others
// need. The membership and head lookups were two thirds of the
// statement's time.
const mergeAcksOK = `
WITH ok AS MATERIALIZED (
    SELECT i.device, i.conv, i.epoch, i.seq
      FROM unnest($1::text[], $2::text[], $3::int[], $4::bigint[], $5::text[]) AS i(device, conv, epoch, seq, usr)
     WHERE EXISTS (SELECT 1 FROM devices d WHERE d.device_id = i.device AND d.install_epoch = i.epoch)`

// mergeCursorsChecks: the user must have been a member of the
// conversation at some time, and seq <= head.
const mergeCursorsChecks = `
       AND coalesce((SELECT true FROM membership_periods m WHERE m.conv_id = i.conv AND m.user_id = i.usr LIMIT 1), false)
       AND i.seq <= (SELECT coalesce(max(e.seq), 0) FROM events e
                      WHERE e.conv_key = (SELECT c.conv_key FROM conversations c WHERE c.conv_id = i.conv))`

// mergeCursorsWrite max-merges the picked acks: each cursor's current
// value (cur) decides whether it is inserted, raised, or left alone; every
// picked ack is answered with the merged value.
const mergeCursorsWrite = `
), cur AS MATERIALIZED (
    SELECT ok.*, c.delivered_seq AS old, c.install_epoch AS old_epoch
      FROM ok LEFT JOIN device_cursors c ON c.device_id = ok.device AND c.conv_id = ok.conv
), raised AS (
    UPDATE device_cursors c SET delivered_seq = greatest(cur.old, cur.seq), install_epoch = cur.epoch
      FROM cur
     WHERE c.device_id = cur.device AND c.conv_id = cur.conv AND (cur.old < cur.seq OR cur.old_epoch <> cur.epoch)
), added AS (
    INSERT INTO device_cursors (device_id, conv_id, install_epoch, delivered_seq)
    SELECT device, conv, epoch, seq FROM cur WHERE old IS NULL
)
SELECT device, conv, epoch::bigint, greatest(coalesce(old, 0), seq) FROM cur`

const (
	mergeKnownCursorsSQL = mergeAcksOK + mergeCursorsWrite
	mergeCursorsSQL      = mergeAcksOK + mergeCursorsChecks + mergeCursorsWrite
)

// deviceLockKey is the advisory lock key of device's cursors.
func deviceLockKey(device string) int64 {
	return changeLockKey(deviceLockNS + device)
}

const diagnoseCursorSQL = `
SELECT coalesce((SELECT install_epoch = $3 FROM devices WHERE device_id = $1), false),
       EXISTS (SELECT 1 FROM membership_periods WHERE conv_id = $2 AND user_id = $4)`

// MergeCursors max-merges delivery cursors (group commit): a cursor never
// moves down. Acks of one batch for the same (device, conv) are merged
// first (the largest wins, and every one of them is answered with the
// merged value); if the largest is refused for its seq (CURSOR_AHEAD),
// the smaller ones are tried again without it, so a bad ack never takes
// a good one down with it. An ack whose epoch is not the device's current
// install_epoch changes nothing (the old install of a reinstalled device).
func (s *Store) MergeCursors(ctx context.Context, ups []CursorUpdate) ([]CursorResult, error) {
	res := make([]CursorResult, len(ups))
	todo := make([]int, len(ups)) // indexes of ups not answered yet
	for i := range todo {
		todo[i] = i
	}
	for len(todo) > 0 {
		// Keyed by epoch too: of two installs' acks only the current one's
		// passes the epoch check, so the insert never meets a key twice.
		largest := map[cursorKey]CursorUpdate{}
		for _, i := range todo {
			u := ups[i]
			k := cursorKey{u.Device, u.Conv, u.Epoch}
			switch m, ok := largest[k]; {
			case !ok || u.Seq > m.Seq:
				largest[k] = u
			case u.Seq == m.Seq && u.Known:
				m.Known = true
				largest[k] = m
			}
		}
		got, err := s.mergeRound(ctx, largest)
		if err != nil {
			return nil, err
		}
		refused := map[cursorKey]error{}
		var retry []int
		for _, i := range todo {
			u := ups[i]
			k := cursorKey{u.Device, u.Conv, u.Epoch}
			if v, ok := got[k]; ok {
				res[i].Delivered = v
				continue
			}
			why, ok := refused[k]
			if !ok {
				if why, err = s.diagnoseCursor(ctx, largest[k]); err != nil {
					return nil, err
				}
				refused[k] = why
			}
			if u.Seq < largest[k].Seq && why == ErrCursorAhead {
				retry = append(retry, i) // a smaller seq may be fine
				continue
			}
			res[i].Err = why
		}
		todo = retry
	}
	return res, nil
}

// cursorKey is a delivery cursor of one install of a device.
type cursorKey struct {
	device, conv string
	epoch        int64
}

// mergeRound merges one update per key (those whose seq the connection
// was given, then the others, which are checked in full) and returns the
// merged value of each key that was not refused.
func (s *Store) mergeRound(ctx context.Context, ups map[cursorKey]CursorUpdate) (map[cursorKey]int64, error) {
	got := map[cursorKey]int64{}
	for _, known := range []bool{true, false} {
		var devices, convs, users []string
		var epochs []int32
		var seqs []int64
		for _, u := range ups {
			if u.Known == known {
				devices, convs, users = append(devices, u.Device), append(convs, u.Conv), append(users, u.User)
				epochs, seqs = append(epochs, int32(u.Epoch)), append(seqs, u.Seq)
			}
		}
		if len(devices) == 0 {
			continue
		}
		sql := mergeCursorsSQL
		if known {
			sql = mergeKnownCursorsSQL
		}
		var err error
		var rows map[cursorKey]int64
		for attempt := 0; attempt < 3; attempt++ {
			rows = map[cursorKey]int64{} // a failed attempt's rows were rolled back
			err = s.queryCursors(ctx, sql, []any{devices, convs, epochs, seqs, users}, func(device, conv string, epoch, delivered int64) {
				rows[cursorKey{device, conv, epoch}] = delivered
			})
			if !isDeadlock(err) {
				break
			}
		}
		if err != nil {
			return nil, err
		}
		maps.Copy(got, rows)
	}
	return got, nil
}

// diagnoseCursor says why u was refused (rare): ErrStaleInstall,
// ErrNotMember or ErrCursorAhead.
func (s *Store) diagnoseCursor(ctx context.Context, u CursorUpdate) (why, err error) {
	var epochOK, member bool
	if err := s.pool.QueryRow(ctx, diagnoseCursorSQL, u.Device, u.Conv, u.Epoch, u.User).Scan(&epochOK, &member); err != nil {
		return nil, err
	}
	switch {
	case !epochOK:
		return ErrStaleInstall, nil
	case !member:
		return ErrNotMember, nil
	default:
		return ErrCursorAhead, nil
	}
}

// queryCursors runs a merge statement and calls row for each row it returns.
func (s *Store) queryCursors(ctx context.Context, sql string, args []any, row func(device, conv string, epoch, delivered int64)) error {
	// The merged cursors are durable once lockedRows returns nil (the
	// transaction commits at the end of the batch).
	return s.lockedRows(ctx, lockExclusiveSQL, lockKeys(deviceLockNS, args[0].([]string)), sql, args,
		func(rows pgx.Rows) error {
			var device, conv string
			var epoch, delivered int64
			if err := rows.Scan(&device, &conv, &epoch, &delivered); err != nil {
				return err
			}
			row(device, conv, epoch, delivered)
			return nil
		})
}
