package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// Role is a current member's role in a group (stored with its membership
// period). Direct conversations have no roles: everyone is RoleMember.
type Role int16

// The roles, lowest first: a moderator acts only on members it outranks.
const (
	RoleMember Role = 0
	RoleAdmin  Role = 1
	RoleOwner  Role = 2
	// roleOperator is the admin API's rank: above every role, and subject
	// to neither the invite policy nor bans.
	roleOperator Role = 3
)

// String is the role's wire name.
func (r Role) String() string {
	switch r {
	case RoleOwner:
		return "owner"
	case RoleAdmin:
		return "admin"
	}
	return "member"
}

// ParseRole returns the role named s ("owner", "admin" or "member").
func ParseRole(s string) (Role, bool) {
	switch s {
	case "owner":
		return RoleOwner, true
	case "admin":
		return RoleAdmin, true
	case "member":
		return RoleMember, true
	}
	return RoleMember, false
}

// Invite policies of a group (conversations.invite).
const (
	InviteAll    = "all"    // any member may add members
	InviteAdmins = "admins" // only the owner and admins may
)

func inviteName(v int16) string {
	if v == 1 {
		return InviteAdmins
	}
	return InviteAll
}

// ErrForbidden: the actor's role, or a restriction of the conversation
// (a mute, a ban, the invite policy, a direct conversation), refuses the
// request. Errors wrapping it are *ForbiddenError, which says why.
var ErrForbidden = errors.New("store: forbidden")

// ForbiddenError is an ErrForbidden with its reason, for the client.
type ForbiddenError struct{ Reason string }

func (e *ForbiddenError) Error() string { return "store: forbidden: " + e.Reason }

// Is makes errors.Is(err, ErrForbidden) match.
func (e *ForbiddenError) Is(target error) bool { return target == ErrForbidden }

func forbidden(format string, args ...any) error {
	return &ForbiddenError{Reason: fmt.Sprintf(format, args...)}
}

// MutedErr is the refusal of a send or edit by a member muted until
// the given time (unix ms).
func MutedErr(until int64) error {
	if until == 0 { // a mute that has been lifted since the seq was given
		return &ForbiddenError{Reason: "muted in this conversation when the message was sent"}
	}
	return &ForbiddenError{Reason: fmt.Sprintf("muted in this conversation until %d (unix ms)", until)}
}

// Update is what an update event changed, stored as the event's attrs:
// each field is set only if the event changed it (MutedUntil 0: unmuted).
type Update struct {
	Role       string  `json:"role,omitempty"`
	MutedUntil *int64  `json:"muted_until,omitempty"`
	Banned     *bool   `json:"banned,omitempty"`
	Title      *string `json:"title,omitempty"`
	Invite     string  `json:"invite,omitempty"`
}

func (u *Update) decode(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return json.Unmarshal(b, u)
}

// UpdateResult is the outcome of a moderation change: the update event's
// seq (0 if the request changed nothing), the leave that followed it (a
// ban of a member), the conversation's head and member count after it,
// and the event's users and changes.
type UpdateResult struct {
	Seq      int64
	LeaveSeq int64
	Head     int64
	Members  int64
	Users    []string
	Update   Update
}

// member is a current member's state.
type member struct {
	role       Role
	mutedUntil int64 // 0: never muted
}

// group is a locked conversation's moderation state, and the actor's rank.
type group struct {
	key     int64
	kind    string
	invite  int16
	members int64
	actor   Role // roleOperator for the admin API
}

// lockGroup takes the conversation's change lock (lockConversation: the
// conversation exists, the actor is a current member) and reads what
// moderation checks. A direct conversation is forbidden: it has no roles.
func lockGroup(ctx context.Context, tx pgx.Tx, ch *MembershipChange) (group, error) {
	var g group
	actor, err := lockActor(ctx, tx, ch)
	if err != nil {
		return g, err
	}
	if err := tx.QueryRow(ctx, `SELECT conv_key, kind, invite, member_count FROM conversations WHERE conv_id = $1`, ch.Conv).
		Scan(&g.key, &g.kind, &g.invite, &g.members); err != nil {
		return g, err
	}
	if g.kind != "group" {
		return g, forbidden("a direct conversation has no roles")
	}
	g.actor = actor.role
	if ch.Actor == "" {
		g.actor = roleOperator
	}
	return g, nil
}

// memberOf returns user's current membership of conv, if any.
func memberOf(ctx context.Context, tx pgx.Tx, conv, user string) (member, bool, error) {
	var m member
	err := tx.QueryRow(ctx, `SELECT role, coalesce(muted_until, 0) FROM membership_periods WHERE conv_id = $1 AND user_id = $2 AND to_seq IS NULL`,
		conv, user).Scan(&m.role, &m.mutedUntil)
	if errors.Is(err, pgx.ErrNoRows) {
		return m, false, nil
	}
	return m, err == nil, err
}

// appendUpdate allocates the change's seq, appends its update event (for
// users, changing u) and records both in r.
func appendUpdate(ctx context.Context, tx pgx.Tx, ch *MembershipChange, key int64, r *UpdateResult, users []string, u Update) error {
	if err := allocate(ctx, tx, ch); err != nil {
		return err
	}
	attrs, err := json.Marshal(u)
	if err != nil {
		return err
	}
	if users == nil {
		users = []string{}
	}
	tag, err := tx.Exec(ctx, `INSERT INTO events (conv_key, seq, kind, sender, ts, users, attrs) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING`,
		key, ch.Seq, KindUpdate, ch.Actor, ch.Ts, users, attrs)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrSeqTaken
	}
	r.Seq, r.Users, r.Update = ch.Seq, users, u
	return nil
}

// finish reads the head and member count after the change into r.
func finish(ctx context.Context, tx pgx.Tx, conv string, r *UpdateResult) error {
	return tx.QueryRow(ctx, `SELECT `+headSQL+`, c.member_count FROM conversations c WHERE c.conv_id = $1`, conv).Scan(&r.Head, &r.Members)
}

// update runs f, a moderation change, in one transaction under the
// conversation's change lock (lockGroup first), and reads the head after.
func (s *Store) update(ctx context.Context, ch *MembershipChange, f func(tx pgx.Tx, g group, r *UpdateResult) error) (UpdateResult, error) {
	var r UpdateResult
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		g, err := lockGroup(ctx, tx, ch)
		if err != nil {
			return err
		}
		if err := f(tx, g, &r); err != nil {
			return err
		}
		return finish(ctx, tx, ch.Conv, &r)
	})
	if err != nil {
		return UpdateResult{}, err
	}
	return r, nil
}

// SetRole gives user the role in the group ch.Conv. Only the owner (or
// the admin API) may; giving RoleOwner transfers ownership (the old owner,
// if any, becomes an admin). The owner cannot change its own role but by
// giving ownership away. Giving a member the role it has appends nothing.
// Errors: ErrNotMember (the actor, or user, is not a current member; also
// an unknown conversation), ErrForbidden.
func (s *Store) SetRole(ctx context.Context, ch *MembershipChange, user string, role Role) (UpdateResult, error) {
	return s.update(ctx, ch, func(tx pgx.Tx, g group, r *UpdateResult) error {
		if g.actor < RoleOwner {
			return forbidden("only the owner may change roles")
		}
		if user == ch.Actor {
			return forbidden("the owner keeps its role until it gives ownership to another member")
		}
		m, ok, err := memberOf(ctx, tx, ch.Conv, user)
		if err != nil {
			return err
		}
		if !ok {
			return &NotMemberError{User: user}
		}
		if m.role == role {
			return nil
		}
		if err := appendUpdate(ctx, tx, ch, g.key, r, []string{user}, Update{Role: role.String()}); err != nil {
			return err
		}
		if role == RoleOwner {
			if _, err := tx.Exec(ctx, `UPDATE membership_periods SET role = $3 WHERE conv_id = $1 AND user_id <> $2 AND to_seq IS NULL AND role = $4`,
				ch.Conv, user, RoleAdmin, RoleOwner); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `UPDATE membership_periods SET role = $3 WHERE conv_id = $1 AND user_id = $2 AND to_seq IS NULL`, ch.Conv, user, role)
		return err
	})
}

// RemoveMembers removes users from the group ch.Conv with one leave event
// (sender: the actor), all of them or none: the owner may remove anyone
// but itself, an admin plain members only (ErrForbidden otherwise). Users
// who are not current members are left out; if none is left, nothing is
// appended. It returns the removed users (sorted), the head and the
// member count after the change.
func (s *Store) RemoveMembers(ctx context.Context, ch *MembershipChange, users []string) (head, members int64, removed []string, err error) {
	r, err := s.update(ctx, ch, func(tx pgx.Tx, g group, r *UpdateResult) error {
		if g.actor < RoleAdmin {
			return forbidden("only the owner and admins may remove members")
		}
		for _, u := range uniqSorted(users) {
			if u == ch.Actor {
				return forbidden("a member leaves with leave, not members_remove")
			}
			m, ok, err := memberOf(ctx, tx, ch.Conv, u)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			if m.role >= g.actor {
				return forbidden("%s is %s: only a higher role may remove it", u, m.role)
			}
			r.Users = append(r.Users, u)
		}
		if len(r.Users) == 0 {
			return nil
		}
		return closePeriods(ctx, tx, ch, r.Users)
	})
	return r.Head, r.Members, r.Users, err
}

// closePeriods ends users' current membership periods at a leave event
// (sender: the actor) appended now, after ch.BeforeLeave.
func closePeriods(ctx context.Context, tx pgx.Tx, ch *MembershipChange, users []string) error {
	if ch.BeforeLeave != nil {
		if err := ch.BeforeLeave(ctx, users); err != nil {
			return err
		}
	}
	if err := allocate(ctx, tx, ch); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE membership_periods SET to_seq = $3 WHERE conv_id = $1 AND user_id = ANY($2) AND to_seq IS NULL`,
		ch.Conv, users, ch.Seq); err != nil {
		return err
	}
	if err := insertMembershipEvent(ctx, tx, *ch, KindLeave, users); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE conversations SET member_count = member_count - $2 WHERE conv_id = $1`, ch.Conv, len(users))
	return err
}

// MuteMember mutes user in the group ch.Conv until mutedUntil (unix ms; 0
// or a time past unmutes): its sends and edits are refused until then.
// The owner and admins may mute members they outrank. A mute that changes
// nothing appends nothing.
func (s *Store) MuteMember(ctx context.Context, ch *MembershipChange, user string, mutedUntil int64) (UpdateResult, error) {
	if mutedUntil <= ch.Ts {
		mutedUntil = 0
	}
	return s.update(ctx, ch, func(tx pgx.Tx, g group, r *UpdateResult) error {
		if g.actor < RoleAdmin {
			return forbidden("only the owner and admins may mute members")
		}
		if user == ch.Actor {
			return forbidden("a member cannot mute itself")
		}
		m, ok, err := memberOf(ctx, tx, ch.Conv, user)
		if err != nil {
			return err
		}
		if !ok {
			return &NotMemberError{User: user}
		}
		if m.role >= g.actor {
			return forbidden("%s is %s: only a higher role may mute it", user, m.role)
		}
		cur := m.mutedUntil
		if cur <= ch.Ts {
			cur = 0
		}
		if cur == mutedUntil {
			return nil
		}
		if err := appendUpdate(ctx, tx, ch, g.key, r, []string{user}, Update{MutedUntil: &mutedUntil}); err != nil {
			return err
		}
		if mutedUntil == 0 {
			_, err = tx.Exec(ctx, `UPDATE membership_periods SET muted_until = NULL, unmuted_seq = $3 WHERE conv_id = $1 AND user_id = $2 AND to_seq IS NULL`,
				ch.Conv, user, ch.Seq)
			return err
		}
		// A mute that only moves muted_until keeps its muted_seq: the
		// member has been muted since then.
		_, err = tx.Exec(ctx, `UPDATE membership_periods SET muted_until = $3,
				muted_seq = CASE WHEN muted_until > $5 THEN muted_seq ELSE $4 END
			WHERE conv_id = $1 AND user_id = $2 AND to_seq IS NULL`,
			ch.Conv, user, mutedUntil, ch.Seq, ch.Ts)
		return err
	})
}

// Ban bans user from the group ch.Conv: an update event (banned), and, if
// user was a member, its removal right after it (a leave event, as
// RemoveMembers). Banned users cannot be added until unbanned. The owner
// and admins may ban users they outrank (anyone who is not a member).
// ErrUnknownUser if user does not exist; banning a banned user appends
// nothing.
func (s *Store) Ban(ctx context.Context, ch *MembershipChange, user string) (UpdateResult, error) {
	return s.update(ctx, ch, func(tx pgx.Tx, g group, r *UpdateResult) error {
		if g.actor < RoleAdmin {
			return forbidden("only the owner and admins may ban")
		}
		if user == ch.Actor {
			return forbidden("a member cannot ban itself")
		}
		if missing, err := missingUserTx(ctx, tx, []string{user}); err != nil {
			return err
		} else if missing != "" {
			return fmt.Errorf("%w: %s", ErrUnknownUser, missing)
		}
		m, isMember, err := memberOf(ctx, tx, ch.Conv, user)
		if err != nil {
			return err
		}
		if isMember && m.role >= g.actor {
			return forbidden("%s is %s: only a higher role may ban it", user, m.role)
		}
		tag, err := tx.Exec(ctx, `INSERT INTO conv_bans (conv_id, user_id, banned_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, ch.Conv, user, ch.Ts)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return nil // banned already (and so not a member)
		}
		yes := true
		if err := appendUpdate(ctx, tx, ch, g.key, r, []string{user}, Update{Banned: &yes}); err != nil {
			return err
		}
		if !isMember {
			return nil
		}
		updateSeq := ch.Seq // closePeriods allocates the leave's
		if err := closePeriods(ctx, tx, ch, r.Users); err != nil {
			return err
		}
		r.LeaveSeq, ch.Seq = ch.Seq, updateSeq
		return nil
	})
}

// Unban lifts user's ban from the group ch.Conv (an update event); it
// does not add the user back. The owner and admins may. Unbanning a user
// who is not banned appends nothing.
func (s *Store) Unban(ctx context.Context, ch *MembershipChange, user string) (UpdateResult, error) {
	return s.update(ctx, ch, func(tx pgx.Tx, g group, r *UpdateResult) error {
		if g.actor < RoleAdmin {
			return forbidden("only the owner and admins may unban")
		}
		tag, err := tx.Exec(ctx, `DELETE FROM conv_bans WHERE conv_id = $1 AND user_id = $2`, ch.Conv, user)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return nil
		}
		no := false
		return appendUpdate(ctx, tx, ch, g.key, r, []string{user}, Update{Banned: &no})
	})
}

// UpdateConv sets the group's title and/or invite policy (InviteAll,
// InviteAdmins; "" keeps it). The owner and admins may. Only what changes
// is in the update event; if nothing does, nothing is appended.
func (s *Store) UpdateConv(ctx context.Context, ch *MembershipChange, title *string, invite string) (UpdateResult, error) {
	return s.update(ctx, ch, func(tx pgx.Tx, g group, r *UpdateResult) error {
		if g.actor < RoleAdmin {
			return forbidden("only the owner and admins may change the conversation")
		}
		var cur string
		if err := tx.QueryRow(ctx, `SELECT title FROM conversations WHERE conv_id = $1`, ch.Conv).Scan(&cur); err != nil {
			return err
		}
		var u Update
		if title != nil && *title != cur {
			u.Title = title
		}
		if invite != "" && invite != inviteName(g.invite) {
			u.Invite = invite
		}
		if u.Title == nil && u.Invite == "" {
			return nil
		}
		if err := appendUpdate(ctx, tx, ch, g.key, r, nil, u); err != nil {
			return err
		}
		newTitle, newInvite := cur, g.invite
		if u.Title != nil {
			newTitle = *u.Title
		}
		if u.Invite != "" {
			newInvite = 0
			if u.Invite == InviteAdmins {
				newInvite = 1
			}
		}
		_, err := tx.Exec(ctx, `UPDATE conversations SET title = $2, invite = $3 WHERE conv_id = $1`, ch.Conv, newTitle, newInvite)
		return err
	})
}

// checkAdd refuses, for AddMembers, a plain member's add when the group's
// invite policy is InviteAdmins, and any add of a banned user (the admin
// API, actor "", is subject to neither). actor is the actor's membership
// (lockActor), users those being added.
func checkAdd(ctx context.Context, tx pgx.Tx, ch *MembershipChange, actor member, users []string) error {
	if ch.Actor == "" {
		return nil
	}
	var kind string
	var invite int16
	if err := tx.QueryRow(ctx, `SELECT kind, invite FROM conversations WHERE conv_id = $1`, ch.Conv).Scan(&kind, &invite); err != nil {
		return err
	}
	if kind != "group" {
		return nil
	}
	if invite == 1 && actor.role < RoleAdmin {
		return forbidden("only the owner and admins may add members to this group")
	}
	var banned string
	err := tx.QueryRow(ctx, `SELECT user_id FROM conv_bans WHERE conv_id = $1 AND user_id = ANY($2) ORDER BY user_id LIMIT 1`, ch.Conv, users).Scan(&banned)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return err
	}
	return forbidden("%s is banned from this group", banned)
}

// MemberInfo is one current member as the admin API lists it.
type MemberInfo struct {
	User       string
	Role       Role
	MutedUntil int64 // 0: not muted now
	FromSeq    int64
}

// Members returns conv's current members (by user id), with their roles
// and mutes still in force at now (unix ms). ErrNotFound for an unknown
// conversation.
func (s *Store) Members(ctx context.Context, conv string, now int64) ([]MemberInfo, error) {
	rows, err := s.pool.Query(ctx, `SELECT m.user_id, CASE WHEN c.kind = 'group' THEN m.role ELSE 0 END,
			CASE WHEN m.muted_until > $2 THEN m.muted_until ELSE 0 END, m.from_seq
		FROM conversations c LEFT JOIN membership_periods m ON m.conv_id = c.conv_id AND m.to_seq IS NULL
		WHERE c.conv_id = $1 ORDER BY m.user_id`, conv, now)
	if err != nil {
		return nil, err
	}
	var out []MemberInfo
	found := false
	for rows.Next() {
		found = true
		var user *string
		var mi MemberInfo
		var role, muted, from *int64
		if err := rows.Scan(&user, &role, &muted, &from); err != nil {
			rows.Close()
			return nil, err
		}
		if user == nil {
			continue // a conversation without members
		}
		mi.User, mi.Role, mi.MutedUntil, mi.FromSeq = *user, Role(*role), *muted, *from
		out = append(out, mi)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if !found {
		return nil, ErrNotFound
	}
	return out, nil
}

func uniqSorted(xs []string) []string {
	out := slices.Clone(xs)
	slices.Sort(out)
	return slices.Compact(out)
}
