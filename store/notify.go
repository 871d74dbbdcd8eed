package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// Registration is a device's notification address (docs/notifications.md).
type Registration struct {
	Device       string
	User         string
	Provider     string // "apns", "fcm" or "webhook"
	Token        string
	Sandbox      bool
	RegisteredAt int64 // Unix ms
}

// RegisterNotify stores r as its device's registration, replacing any
// earlier one, and reports whether it replaced a registration with
// another address (provider, token or environment): the old address must
// then be withdrawn (notify.Notifier.Withdraw). ErrNotFound if the device
// does not exist.
func (s *Store) RegisterNotify(ctx context.Context, r Registration) (replaced bool, err error) {
	err = s.pool.QueryRow(ctx, `WITH old AS (SELECT provider, token, sandbox FROM notify_registrations WHERE device_id = $1),
		up AS (INSERT INTO notify_registrations (device_id, user_id, provider, token, sandbox, registered_at)
			VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (device_id) DO UPDATE SET user_id = excluded.user_id, provider = excluded.provider, token = excluded.token,
				sandbox = excluded.sandbox, registered_at = excluded.registered_at)
		SELECT coalesce((SELECT provider <> $3 OR token <> $4 OR sandbox <> $5 FROM old), false)`,
		r.Device, r.User, r.Provider, r.Token, r.Sandbox, r.RegisteredAt).Scan(&replaced)
	if isForeignKeyViolation(err) {
		return false, ErrNotFound
	}
	return replaced, err
}

// UnregisterNotify deletes the device's registration, if any.
func (s *Store) UnregisterNotify(ctx context.Context, device string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM notify_registrations WHERE device_id = $1`, device)
	return err
}

// DropNotifyToken deletes the device's registration if it is still the
// one made at registeredAt (Unix ms) or before with token: a provider
// said the token is invalid. A registration made since stays, with
// another token or the same one again (the app was handed it anew). It
// reports whether one was deleted.
func (s *Store) DropNotifyToken(ctx context.Context, device, token string, registeredAt int64) (bool, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM notify_registrations WHERE device_id = $1 AND token = $2 AND registered_at <= $3`,
		device, token, registeredAt)
	return tag.RowsAffected() > 0, err
}

// NotifyRegistrations returns the registrations of the devices among
// devices that have one, by device id: only those that may be used now,
// of devices not revoked and users not suspended. Every notification is
// sent with the registration read here just before (docs/notifications.md,
// "Withdrawing an address").
func (s *Store) NotifyRegistrations(ctx context.Context, devices []string) (map[string]Registration, error) {
	rows, err := s.pool.Query(ctx, `SELECT r.device_id, r.user_id, r.provider, r.token, r.sandbox, r.registered_at
		FROM notify_registrations r
		JOIN devices d ON d.device_id = r.device_id AND d.revoked_at IS NULL
		JOIN users u ON u.user_id = r.user_id AND NOT u.suspended
		WHERE r.device_id = ANY($1)`, devices)
	if err != nil {
		return nil, err
	}
	regs, err := pgx.CollectRows(rows, scanRegistration)
	if err != nil {
		return nil, err
	}
	out := make(map[string]Registration, len(regs))
	for _, r := range regs {
		out[r.Device] = r
	}
	return out, nil
}

// UserRegistrations returns the registrations of user's devices.
func (s *Store) UserRegistrations(ctx context.Context, user string) ([]Registration, error) {
	rows, err := s.pool.Query(ctx, `SELECT device_id, user_id, provider, token, sandbox, registered_at
		FROM notify_registrations WHERE user_id = $1 ORDER BY device_id`, user)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanRegistration)
}

func scanRegistration(r pgx.CollectableRow) (Registration, error) {
	var g Registration
	err := r.Scan(&g.Device, &g.User, &g.Provider, &g.Token, &g.Sandbox, &g.RegisteredAt)
	return g, err
}

// SetMute sets user's muted_until in conv (Unix ms; 0 unmutes).
// ErrNotMember if the user was never a member of conv (or it does not
// exist); a former member may still set it.
func (s *Store) SetMute(ctx context.Context, user, conv string, mutedUntil int64) error {
	tag, err := s.pool.Exec(ctx, `INSERT INTO conv_settings (user_id, conv_id, muted_until)
		SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM membership_periods WHERE conv_id = $2 AND user_id = $1)
		ON CONFLICT (user_id, conv_id) DO UPDATE SET muted_until = excluded.muted_until`, user, conv, mutedUntil)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrNotMember
	}
	return nil
}

// NotifyEvent names a committed event to consider for notifications;
// MentionsOnly restricts the recipients to the users it mentions (the pull
// tier).
type NotifyEvent struct {
	Conv         string
	Seq          int64
	MentionsOnly bool
}

// NotifyTarget is one registered device of a recipient of a message, as
// the notification policy needs it.
type NotifyTarget struct {
	Event      int // index into the events asked for
	Sender     string
	Ts         int64
	Title      string // the conversation's title
	Body       []byte
	Reg        Registration
	Delivered  int64 // the device's delivery cursor in the conversation
	MutedUntil int64 // the user's muted_until there
	Mentioned  bool
}

// NotifyTargets returns, for each event that is a msg not recalled, the
// registered devices of its recipients: users other than the sender whose
// membership periods contain its seq (only those it mentions, for
// MentionsOnly events), with their cursors and mute settings, read in one
// statement.
func (s *Store) NotifyTargets(ctx context.Context, evs []NotifyEvent) ([]NotifyTarget, error) {
	convs, seqs, only := make([]string, len(evs)), make([]int64, len(evs)), make([]bool, len(evs))
	for i, e := range evs {
		convs[i], seqs[i], only[i] = e.Conv, e.Seq, e.MentionsOnly
	}
	// Index lookups per event, on the generic plan: written as a plain
	// join, it was planned anew on many of its calls (BENCHMARKS.md, the
	// row "at 3821fc3" on the targets statement's plans), and a generic
	// plan of a plain join may hash whole tables.
	var out []NotifyTarget
	err := s.genericRows(ctx, `SELECT k.i - 1, e.sender, e.ts, c.title, coalesce(e.body, ''::bytea),
			r.device_id, r.user_id, r.provider, r.token, r.sandbox, r.registered_at,
			coalesce((SELECT dc.delivered_seq FROM device_cursors dc WHERE dc.device_id = r.device_id AND dc.conv_id = k.conv), 0),
			coalesce((SELECT cs.muted_until FROM conv_settings cs WHERE cs.user_id = m.user_id AND cs.conv_id = k.conv), 0),
			coalesce(m.user_id = ANY(e.mentions), false)
		FROM unnest($1::text[], $2::bigint[], $3::bool[]) WITH ORDINALITY AS k(conv, seq, only_mentions, i)
		CROSS JOIN LATERAL (SELECT cv.conv_key, cv.title FROM conversations cv WHERE cv.conv_id = k.conv) c
		CROSS JOIN LATERAL (SELECT ev.sender, ev.ts, ev.body, ev.mentions FROM events ev
		                    WHERE ev.conv_key = c.conv_key AND ev.seq = k.seq AND ev.kind = 1 AND ev.recalled_by IS NULL) e
		CROSS JOIN LATERAL (SELECT mp.user_id FROM membership_periods mp
		                    WHERE mp.conv_id = k.conv AND mp.from_seq <= k.seq AND (mp.to_seq IS NULL OR mp.to_seq >= k.seq)
		                      AND mp.user_id <> e.sender AND (NOT k.only_mentions OR mp.user_id = ANY(e.mentions))) m
		CROSS JOIN LATERAL (SELECT nr.device_id, nr.user_id, nr.provider, nr.token, nr.sandbox, nr.registered_at
		                    FROM notify_registrations nr WHERE nr.user_id = m.user_id) r`,
		[]any{convs, seqs, only}, func(rows pgx.Rows) error {
			var t NotifyTarget
			err := rows.Scan(&t.Event, &t.Sender, &t.Ts, &t.Title, &t.Body, &t.Reg.Device, &t.Reg.User, &t.Reg.Provider, &t.Reg.Token,
				&t.Reg.Sandbox, &t.Reg.RegisteredAt, &t.Delivered, &t.MutedUntil, &t.Mentioned)
			out = append(out, t)
			return err
		})
	return out, err
}

// RecallInfo is a recall event as notifications need it: the recalled
// seq, and the registered devices of users whose periods contain it.
type RecallInfo struct {
	Target  int64
	Devices []Registration
}

// RecallTargets reads the recall event at (conv, seq). ErrNotFound if it
// is not a recall. Its devices are those of users whose membership
// periods contain both the recalled message and the recall: a user who
// left in between is told nothing of events after they left.
func (s *Store) RecallTargets(ctx context.Context, conv string, seq int64) (RecallInfo, error) {
	var ri RecallInfo
	err := s.pool.QueryRow(ctx, `SELECT coalesce(e.target, 0) FROM conversations c JOIN events e ON e.conv_key = c.conv_key
		WHERE c.conv_id = $1 AND e.seq = $2 AND e.kind = 4`, conv, seq).Scan(&ri.Target)
	if errors.Is(err, pgx.ErrNoRows) {
		return ri, ErrNotFound
	}
	if err != nil {
		return ri, err
	}
	rows, err := s.pool.Query(ctx, `SELECT r.device_id, r.user_id, r.provider, r.token, r.sandbox, r.registered_at
		FROM membership_periods m JOIN notify_registrations r ON r.user_id = m.user_id
		WHERE m.conv_id = $1 AND m.from_seq <= $2 AND (m.to_seq IS NULL OR m.to_seq >= $3)`, conv, ri.Target, seq)
	if err != nil {
		return ri, err
	}
	ri.Devices, err = pgx.CollectRows(rows, scanRegistration)
	return ri, err
}

// DeviceConv is a (device, conversation) pair.
type DeviceConv struct{ Device, Conv string }

// DeliveredOf returns the delivery cursors of the pairs (0 when none).
func (s *Store) DeliveredOf(ctx context.Context, pairs []DeviceConv) (map[DeviceConv]int64, error) {
	devs, convs := make([]string, len(pairs)), make([]string, len(pairs))
	for i, p := range pairs {
		devs[i], convs[i] = p.Device, p.Conv
	}
	rows, err := s.pool.Query(ctx, `SELECT dc.device_id, dc.conv_id, dc.delivered_seq
		FROM unnest($1::text[], $2::text[]) AS k(device, conv)
		JOIN device_cursors dc ON dc.device_id = k.device AND dc.conv_id = k.conv`, devs, convs)
	if err != nil {
		return nil, err
	}
	out := make(map[DeviceConv]int64, len(pairs))
	for rows.Next() {
		var p DeviceConv
		var d int64
		if err := rows.Scan(&p.Device, &p.Conv, &d); err != nil {
			rows.Close()
			return nil, err
		}
		out[p] = d
	}
	return out, rows.Err()
}

// UnreadTotals returns each user's total unread count over every
// conversation they are or were a member of (the per-conversation unread
// of docs/protocol.md §4, summed), read in one snapshot.
func (s *Store) UnreadTotals(ctx context.Context, users []string) (map[string]int64, error) {
	// On the generic plan: planning the statement, with the unread
	// function inlined, is costly (BENCHMARKS.md, the row "at 94b4955" on
	// planning the badge statement).
	out := make(map[string]int64, len(users))
	err := s.genericRows(ctx, unreadTotalsSQL, []any{users}, func(rows pgx.Rows) error {
		var u string
		var n int64
		err := rows.Scan(&u, &n)
		out[u] = n
		return err
	})
	return out, err
}

// unreadTotalsSQL sums the unread counts of each user's conversations
// ($1: users). Conversations whose head is not above the read position
// (most of a user's, usually) have nothing unread and are skipped by an
// index probe instead of being counted; the others are counted by
// parley_unread_at from the conversation's row and head read for that
// probe.
const unreadTotalsSQL = `SELECT k.usr, coalesce(t.n, 0)::bigint
  FROM unnest($1::text[]) AS k(usr)
  LEFT JOIN LATERAL (
        SELECT sum(x.unread) AS n
          FROM (SELECT p.conv_id, coalesce(rp.read_seq, 0) AS r, cv.conv_key, h.head, coalesce(cv.dense_seq, 0) AS w
                  FROM (SELECT DISTINCT conv_id FROM membership_periods WHERE user_id = k.usr) p
                  JOIN conversations cv ON cv.conv_id = p.conv_id
                  CROSS JOIN LATERAL (SELECT coalesce(max(e.seq), 0) AS head FROM events e WHERE e.conv_key = cv.conv_key) h
                  LEFT JOIN read_positions rp ON rp.user_id = k.usr AND rp.conv_id = p.conv_id
                 WHERE h.head > coalesce(rp.read_seq, 0)
                OFFSET 0) c
          CROSS JOIN LATERAL parley_unread_at(c.conv_id, k.usr, c.r, c.conv_key, c.head, c.w) x) t ON true`
