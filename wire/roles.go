package wire

import "github.com/vmihailenco/msgpack/v5"

// Roles and moderation (docs/protocol.md §9): the requests, their reply,
// and what an update event carries.

// Moderation requests.
const (
	TRole          = "role"
	TMembersRemove = "members_remove"
	TMemberMute    = "member_mute"
	TBan           = "ban"
	TUnban         = "unban"
	TConvUpdate    = "conv_update"
	// TUpdateOK answers role, member_mute, ban, unban and conv_update.
	TUpdateOK = "update_ok"
)

// KindUpdate is the kind of the event a moderation change appends.
const KindUpdate = "update"

// Member roles in a group.
const (
	RoleOwner  = "owner"
	RoleAdmin  = "admin"
	RoleMember = "member"
)

// Invite policies of a group (conv_update.invite): who may add members.
const (
	InviteAll    = "all"
	InviteAdmins = "admins"
)

// ValidRole reports whether r is a role a request may name.
func ValidRole(r string) bool { return r == RoleOwner || r == RoleAdmin || r == RoleMember }

// ValidInvite reports whether p is an invite policy.
func ValidInvite(p string) bool { return p == InviteAll || p == InviteAdmins }

// Update is what an update event changed, for the users it lists: each
// field is set only if the event changed it. MutedUntil 0 means unmuted.
// It is embedded in Event, Push and Message: its keys are theirs.
type Update struct {
	Role       string  `msgpack:"role,omitempty"`
	MutedUntil *int64  `msgpack:"muted_until,omitempty"`
	Banned     *bool   `msgpack:"banned,omitempty"`
	Title      *string `msgpack:"title,omitempty"`
	Invite     string  `msgpack:"invite,omitempty"`
}

// fields is how many keys appendTo writes.
func (u *Update) fields() int {
	return count(u.Role != "", u.MutedUntil != nil, u.Banned != nil, u.Title != nil, u.Invite != "")
}

func (u *Update) appendTo(b []byte) []byte {
	if u.Role != "" {
		b = kvStr(b, "role", u.Role)
	}
	if u.MutedUntil != nil {
		b = kvInt(b, "muted_until", *u.MutedUntil)
	}
	if u.Banned != nil {
		b = kvBool(b, "banned", *u.Banned)
	}
	if u.Title != nil {
		b = kvStr(b, "title", *u.Title)
	}
	if u.Invite != "" {
		b = kvStr(b, "invite", u.Invite)
	}
	return b
}

// field decodes key k of an update event into u; ok is false for a key
// that is not one of Update's.
func (u *Update) field(r *reader, k string) (ok bool, err *Error) {
	switch k {
	case "role":
		return true, r.getStr("role", &u.Role)
	case "muted_until":
		var v int64
		err := r.getInt("muted_until", &v)
		u.MutedUntil = &v
		return true, err
	case "banned":
		var v bool
		err := r.getBool("banned", &v)
		u.Banned = &v
		return true, err
	case "title":
		var v string
		err := r.getStr("title", &v)
		u.Title = &v
		return true, err
	case "invite":
		return true, r.getStr("invite", &u.Invite)
	}
	return false, nil
}

// UpdateOK answers role, member_mute, ban, unban and conv_update: Seq is
// the update event's seq, or, if the request changed nothing (it asked
// for what already was), the conversation's head.
type UpdateOK struct {
	T    string `msgpack:"t"`
	Rid  string `msgpack:"rid"`
	Conv string `msgpack:"conv"`
	Seq  int64  `msgpack:"seq"`
}

func (r UpdateOK) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 4)
	b = kvStr(b, "t", orT(r.T, TUpdateOK))
	b = kvStr(b, "rid", r.Rid)
	b = kvStr(b, "conv", r.Conv)
	return kvInt(b, "seq", r.Seq)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r UpdateOK) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// Muted returns MutedUntil, 0 if absent.
func (u *Update) Muted() int64 {
	if u.MutedUntil == nil {
		return 0
	}
	return *u.MutedUntil
}
