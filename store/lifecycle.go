package store

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// NewLogin is a user and device named by a valid JWT, to be created if
// they do not exist.
type NewLogin struct {
	User, Device string
}

// ProvisionDevices creates the users and devices of logins that do not
// exist yet (a device gets no static token), in one statement, and
// changes nothing that exists: a device that exists under another user
// stays that user's. Concurrent calls for the same ids are safe (the
// rows are inserted in id order, ON CONFLICT DO NOTHING, so the second
// waits for the first and then does nothing). Ids that cannot be stored
// are skipped.
func (s *Store) ProvisionDevices(ctx context.Context, logins []NewLogin) error {
	users := make([]string, 0, len(logins))
	ls := make([]NewLogin, 0, len(logins))
	for _, l := range logins {
		if storable(l.User) && storable(l.Device) {
			users = append(users, l.User)
			ls = append(ls, l)
		}
	}
	if len(ls) == 0 {
		return nil
	}
	slices.Sort(users)
	users = slices.Compact(users)
	slices.SortFunc(ls, func(a, b NewLogin) int { return strings.Compare(a.Device, b.Device) })
	devUsers, devs := make([]string, len(ls)), make([]string, len(ls))
	for i, l := range ls {
		devUsers[i], devs[i] = l.User, l.Device
	}
	const q = `WITH u AS (
		INSERT INTO users (user_id) SELECT id FROM unnest($1::text[]) AS t(id) ORDER BY id ON CONFLICT DO NOTHING)
	INSERT INTO devices (device_id, user_id, token_sha256)
		SELECT d, u, '\x'::bytea FROM unnest($2::text[], $3::text[]) AS t(d, u) ORDER BY d
		ON CONFLICT DO NOTHING`
	var err error
	for range 3 { // a deadlock with a concurrent provisioning is retried
		if _, err = s.pool.Exec(ctx, q, users, devs, devUsers); !isDeadlock(err) {
			break
		}
	}
	return err
}

// RevokeDevice revokes a device for good: its static token is dropped and
// nothing authenticates it any more, and its notification registration is
// deleted; the row stays, so that the id cannot be provisioned again by a
// JWT. Revoking a revoked device changes nothing. It returns the device's
// user, or ErrNotFound.
func (s *Store) RevokeDevice(ctx context.Context, id string) (string, error) {
	var user string
	err := s.pool.QueryRow(ctx, `WITH r AS (DELETE FROM notify_registrations WHERE device_id = $1)
		UPDATE devices SET revoked_at = coalesce(revoked_at, now()), token_sha256 = '\x'::bytea
		WHERE device_id = $1 RETURNING user_id`, id).Scan(&user)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	return user, err
}

// RotateToken replaces the static token of a device that is not revoked
// (by the SHA-256 of the new one) and returns its user, or ErrNotFound.
func (s *Store) RotateToken(ctx context.Context, id string, sha []byte) (string, error) {
	var user string
	err := s.pool.QueryRow(ctx, `UPDATE devices SET token_sha256 = $2 WHERE device_id = $1 AND revoked_at IS NULL RETURNING user_id`, id, sha).Scan(&user)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	return user, err
}

// SetSuspended suspends or unsuspends a user, or returns ErrNotFound.
func (s *Store) SetSuspended(ctx context.Context, user string, suspended bool) error {
	tag, err := s.pool.Exec(ctx, `UPDATE users SET suspended = $2 WHERE user_id = $1`, user, suspended)
	if err == nil && tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return err
}

// User is a user row with its devices that are not revoked.
type User struct {
	ID        string
	Suspended bool
	Devices   []Device // in id order
}

// UserByID returns the user and its devices that are not revoked, or
// ErrNotFound.
func (s *Store) UserByID(ctx context.Context, id string) (User, error) {
	u := User{ID: id}
	if !storable(id) {
		return u, ErrNotFound
	}
	err := s.readTx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT suspended FROM users WHERE user_id = $1`, id).Scan(&u.Suspended)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT `+deviceColumns+` FROM devices d JOIN users u USING (user_id)
			WHERE d.user_id = $1 AND d.revoked_at IS NULL ORDER BY d.device_id`, id)
		if err != nil {
			return err
		}
		u.Devices, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Device, error) { return scanDevice(r) })
		return err
	})
	return u, err
}
