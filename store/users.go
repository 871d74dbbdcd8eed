package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// Device is a device row as the gateway needs it at auth.
type Device struct {
	ID           string
	User         string
	TokenSHA256  []byte // empty: no static token (provisioned by a JWT, or revoked)
	InstallEpoch int64
	Revoked      bool // the device was revoked: nothing authenticates it
	Suspended    bool // its user is suspended
}

// deviceColumns are the columns scanDevice reads, from devices d joined
// with users u.
const deviceColumns = `d.device_id, d.user_id, d.token_sha256, d.install_epoch, d.revoked_at IS NOT NULL, u.suspended`

func scanDevice(r pgx.Row) (Device, error) {
	var d Device
	err := r.Scan(&d.ID, &d.User, &d.TokenSHA256, &d.InstallEpoch, &d.Revoked, &d.Suspended)
	return d, err
}

// CreateUsers inserts users in one transaction (COPY). Any id that exists
// already fails the whole call with ErrExists.
func (s *Store) CreateUsers(ctx context.Context, ids []string) error {
	rows := make([][]any, len(ids))
	for i, id := range ids {
		rows[i] = []any{id}
	}
	_, err := s.pool.CopyFrom(ctx, pgx.Identifier{"users"}, []string{"user_id"}, pgx.CopyFromRows(rows))
	if isUniqueViolation(err) {
		return ErrExists
	}
	return err
}

// CreateDevices inserts devices (COPY) whose users must exist. Any id that
// exists already fails the whole call with ErrExists; an unknown user with
// ErrNotFound.
func (s *Store) CreateDevices(ctx context.Context, devs []Device) error {
	rows := make([][]any, len(devs))
	for i, d := range devs {
		rows[i] = []any{d.ID, d.User, d.TokenSHA256}
	}
	_, err := s.pool.CopyFrom(ctx, pgx.Identifier{"devices"}, []string{"device_id", "user_id", "token_sha256"}, pgx.CopyFromRows(rows))
	switch {
	case isUniqueViolation(err):
		return ErrExists
	case isForeignKeyViolation(err):
		return ErrNotFound
	}
	return err
}

// DeviceByID returns the device row, or ErrNotFound.
func (s *Store) DeviceByID(ctx context.Context, id string) (Device, error) {
	d, err := scanDevice(s.pool.QueryRow(ctx, `SELECT `+deviceColumns+` FROM devices d JOIN users u USING (user_id) WHERE d.device_id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Device{ID: id}, ErrNotFound
	}
	return d, err
}

// DevicesByID returns the rows of the devices among ids that exist (in
// no particular order), with one query: the gateway looks up the devices
// of many concurrent auths together. An id that cannot be stored (not
// UTF-8, or with a NUL byte) is simply not found.
func (s *Store) DevicesByID(ctx context.Context, ids []string) ([]Device, error) {
	ok := make([]string, 0, len(ids))
	for _, id := range ids {
		if storable(id) {
			ok = append(ok, id)
		}
	}
	if len(ok) == 0 {
		return nil, nil
	}
	// Every auth looks its device up, many per statement (the gateway
	// combines them): with the generic plan, index lookups per id.
	var out []Device
	err := s.genericRows(ctx, `SELECT `+deviceColumns+` FROM unnest($1::text[]) AS k(id)
		CROSS JOIN LATERAL (SELECT * FROM devices d WHERE d.device_id = k.id LIMIT 1) d
		CROSS JOIN LATERAL (SELECT * FROM users u WHERE u.user_id = d.user_id LIMIT 1) u`, []any{ok}, func(rows pgx.Rows) error {
		d, err := scanDevice(rows)
		out = append(out, d)
		return err
	})
	return out, err
}

// Reinstall starts a new install of the device: install_epoch + 1, its
// delivery cursors and its notification registration deleted, in one
// transaction. Read positions (per user) are untouched. It holds the
// device's cursor lock (see mergeCursorsSQL), so acks still in flight from
// the old install either are written before this (and deleted by it) or
// see the new epoch.
func (s *Store) Reinstall(ctx context.Context, id string) (int64, error) {
	var epoch int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, deviceLockKey(id)); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, `UPDATE devices SET install_epoch = install_epoch + 1 WHERE device_id = $1 RETURNING install_epoch`, id).Scan(&epoch)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if _, err = tx.Exec(ctx, `DELETE FROM device_cursors WHERE device_id = $1`, id); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM notify_registrations WHERE device_id = $1`, id)
		return err
	})
	return epoch, err
}
