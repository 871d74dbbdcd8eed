package wire

import "github.com/vmihailenco/msgpack/v5"

// Frame type names (the `t` of every frame).
const (
	// client → server
	TAuth       = "auth"
	TPing       = "ping"
	TConvCreate = "conv_create"
	TMembersAdd = "members_add"
	TLeave      = "leave"
	TSend       = "send"
	TSync       = "sync"
	TAck        = "ack"
	TRead       = "read"
	TConvs      = "convs"
	TSnapshot   = "snapshot"
	TRecall     = "recall"
	TEdit       = "edit"
	TClear      = "clear"
	TTyping     = "typing" // also the relayed push
	TReceipts   = "receipts"
	TSettings   = "settings"

	TNotifyRegister   = "notify_register"
	TNotifyUnregister = "notify_unregister"
	TConvSettings     = "conv_settings"
	TRefresh          = "refresh"

	// server → client replies
	TAuthOK       = "auth_ok"
	TPong         = "pong"
	TConvCreateOK = "conv_create_ok"
	TMembersOK    = "members_ok"
	TSendOK       = "send_ok"
	TSyncOK       = "sync_ok"
	TAckOK        = "ack_ok"
	TReadOK       = "read_ok"
	TConvsOK      = "convs_ok"
	TSnapshotOK   = "snapshot_ok"
	TRecallOK     = "recall_ok"
	TEditOK       = "edit_ok"
	TClearOK      = "clear_ok"
	TReceiptsOK   = "receipts_ok"
	TSettingsOK   = "settings_ok"
	TRefreshOK    = "refresh_ok"

	// server → client pushes
	TPush        = "push"
	THint        = "hint"
	TReadChanged = "read_changed"
	TReceipt     = "receipt"
	TKick        = "kick"
	TError       = "error"
)

// Event kinds.
const (
	KindMsg    = "msg"
	KindJoin   = "join"
	KindLeave  = "leave"
	KindRecall = "recall"
	KindEdit   = "edit"
)

// Conversation kinds (conv_create.kind).
const (
	ConvGroup  = "group"
	ConvDirect = "direct"
)

// Fan-out modes (convs_ok.items[].mode).
const (
	ModePush   = "push"
	ModeOnline = "online"
	ModePull   = "pull"
)

// Kick reasons.
const (
	KickReplaced  = "replaced"
	KickShutdown  = "shutdown"
	KickExpired   = "expired"   // the JWT's exp passed without a refresh
	KickRevoked   = "revoked"   // the device was revoked or its token rotated
	KickSuspended = "suspended" // the user was suspended
)

// The reply and push types below are encoded by hand (see AppendFrame): the
// struct tags document the wire names and are what msgpack.Unmarshal (and
// DecodeMessage) use; the encoders write exactly those keys, omitting the
// omitempty ones when zero. If T is left empty, the encoder writes the
// type's frame name. Body fields are always written as msgpack bin (an empty
// bin for nil). Slices that are not omitempty are written as arrays, empty
// when nil.

// AuthOK answers auth.
type AuthOK struct {
	T            string `msgpack:"t"`
	Rid          string `msgpack:"rid"`
	User         string `msgpack:"user"`
	Device       string `msgpack:"device"`
	InstallEpoch int64  `msgpack:"install_epoch"`
	Ts           int64  `msgpack:"ts"`
	ExpiresAt    int64  `msgpack:"expires_at,omitempty"` // Unix ms: the JWT's exp; absent for a static token
}

func (r AuthOK) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 6+count(r.ExpiresAt != 0))
	b = kvStr(b, "t", orT(r.T, TAuthOK))
	b = kvStr(b, "rid", r.Rid)
	b = kvStr(b, "user", r.User)
	b = kvStr(b, "device", r.Device)
	b = kvInt(b, "install_epoch", r.InstallEpoch)
	if r.ExpiresAt != 0 {
		b = kvInt(b, "expires_at", r.ExpiresAt)
	}
	return kvInt(b, "ts", r.Ts)
}

// RefreshOK answers refresh: the connection now lives until ExpiresAt.
type RefreshOK struct {
	T         string `msgpack:"t"`
	Rid       string `msgpack:"rid"`
	ExpiresAt int64  `msgpack:"expires_at"` // Unix ms
}

func (r RefreshOK) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 3)
	b = kvStr(b, "t", orT(r.T, TRefreshOK))
	b = kvStr(b, "rid", r.Rid)
	return kvInt(b, "expires_at", r.ExpiresAt)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r RefreshOK) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r AuthOK) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// Pong answers ping (rid echoed when the ping had one).
type Pong struct {
	T   string `msgpack:"t"`
	Rid string `msgpack:"rid,omitempty"`
	Ts  int64  `msgpack:"ts"`
}

func (r Pong) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 2+count(r.Rid != ""))
	b = kvStr(b, "t", orT(r.T, TPong))
	if r.Rid != "" {
		b = kvStr(b, "rid", r.Rid)
	}
	return kvInt(b, "ts", r.Ts)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r Pong) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// ConvCreateOK answers conv_create.
type ConvCreateOK struct {
	T    string `msgpack:"t"`
	Rid  string `msgpack:"rid"`
	Conv string `msgpack:"conv"`
	Head int64  `msgpack:"head"`
}

func (r ConvCreateOK) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 4)
	b = kvStr(b, "t", orT(r.T, TConvCreateOK))
	b = kvStr(b, "rid", r.Rid)
	b = kvStr(b, "conv", r.Conv)
	return kvInt(b, "head", r.Head)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r ConvCreateOK) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// MembersOK answers members_add and leave.
type MembersOK struct {
	T    string `msgpack:"t"`
	Rid  string `msgpack:"rid"`
	Conv string `msgpack:"conv"`
	Head int64  `msgpack:"head"`
}

func (r MembersOK) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 4)
	b = kvStr(b, "t", orT(r.T, TMembersOK))
	b = kvStr(b, "rid", r.Rid)
	b = kvStr(b, "conv", r.Conv)
	return kvInt(b, "head", r.Head)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r MembersOK) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// SendOK answers send. Dup is true when (sender, cmid) was already stored.
type SendOK struct {
	T    string `msgpack:"t"`
	Rid  string `msgpack:"rid"`
	Conv string `msgpack:"conv"`
	Cmid string `msgpack:"cmid"`
	Seq  int64  `msgpack:"seq"`
	Ts   int64  `msgpack:"ts"`
	Dup  bool   `msgpack:"dup,omitempty"`
}

func (r SendOK) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 6+count(r.Dup))
	b = kvStr(b, "t", orT(r.T, TSendOK))
	b = kvStr(b, "rid", r.Rid)
	b = kvStr(b, "conv", r.Conv)
	b = kvStr(b, "cmid", r.Cmid)
	b = kvInt(b, "seq", r.Seq)
	b = kvInt(b, "ts", r.Ts)
	if r.Dup {
		b = kvBool(b, "dup", true)
	}
	return b
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r SendOK) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// Event is one event of a conversation log: the event map of
// docs/protocol.md §3, as carried by sync_ok, snapshot_ok items and
// (flattened, beside t and conv) push. Its encoder (appendFields) is the
// only one of the event map: every frame that carries an event writes it
// through Event, so every path gives an event the same keys.
type Event struct {
	Seq      int64    `msgpack:"seq"`
	Kind     string   `msgpack:"kind"`
	Sender   string   `msgpack:"sender"`
	Body     []byte   `msgpack:"body"`
	Ts       int64    `msgpack:"ts"`
	Cmid     string   `msgpack:"cmid,omitempty"`
	Recalled bool     `msgpack:"recalled,omitempty"`
	Target   int64    `msgpack:"target,omitempty"`
	Users    []string `msgpack:"users,omitempty"`
	Mentions []string `msgpack:"mentions,omitempty"`
	// Edited is the ts of the message's newest edit (msg only; Body is
	// then the edited body).
	Edited int64 `msgpack:"edited,omitempty"`
	Update       // what an update event changed
}

// EventFields is Event under another name, the name of the field by which
// Push and Message embed it (their method Event returns it).
type EventFields = Event

func (ev Event) appendMsgpack(b []byte) []byte { return ev.appendTo(b) }

func (ev *Event) appendTo(b []byte) []byte {
	return ev.appendFields(appendMapLen(b, ev.fields()))
}

// fields is how many keys appendFields writes: seq, kind, sender, body and
// ts always, the others when not empty, false or zero.
func (ev *Event) fields() int {
	return 5 + ev.Update.fields() + count(ev.Cmid != "", ev.Recalled, ev.Target != 0, len(ev.Users) > 0, len(ev.Mentions) > 0, ev.Edited != 0)
}

// appendFields appends the event's keys and values (not the map header).
func (ev *Event) appendFields(b []byte) []byte {
	b = kvInt(b, "seq", ev.Seq)
	b = kvStr(b, "kind", ev.Kind)
	b = kvStr(b, "sender", ev.Sender)
	b = kvBin(b, "body", ev.Body)
	b = kvInt(b, "ts", ev.Ts)
	if ev.Cmid != "" {
		b = kvStr(b, "cmid", ev.Cmid)
	}
	if ev.Recalled {
		b = kvBool(b, "recalled", true)
	}
	if ev.Target != 0 {
		b = kvInt(b, "target", ev.Target)
	}
	if len(ev.Users) > 0 {
		b = kvStrs(b, "users", ev.Users)
	}
	if len(ev.Mentions) > 0 {
		b = kvStrs(b, "mentions", ev.Mentions)
	}
	if ev.Edited != 0 {
		b = kvInt(b, "edited", ev.Edited)
	}
	return ev.Update.appendTo(b)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (ev Event) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, ev) }

func appendEvents(b []byte, k string, evs []Event) []byte {
	b = appendArrayLen(appendStr(b, k), len(evs))
	for i := range evs {
		b = evs[i].appendTo(b)
	}
	return b
}

// SyncOK answers sync. More and Events are always written (Events as an
// empty array when there are none).
type SyncOK struct {
	T      string  `msgpack:"t"`
	Rid    string  `msgpack:"rid"`
	Conv   string  `msgpack:"conv"`
	Epoch  int64   `msgpack:"epoch"`
	Head   int64   `msgpack:"head"`
	MinSeq int64   `msgpack:"min_seq"`
	Upto   int64   `msgpack:"upto"`
	More   bool    `msgpack:"more"`
	Events []Event `msgpack:"events"`
}

func (r SyncOK) appendMsgpack(b []byte) []byte { return r.appendTo(b) }

func (r *SyncOK) appendTo(b []byte) []byte {
	b = appendMapLen(b, 9)
	b = kvStr(b, "t", orT(r.T, TSyncOK))
	b = kvStr(b, "rid", r.Rid)
	b = kvStr(b, "conv", r.Conv)
	b = kvInt(b, "epoch", r.Epoch)
	b = kvInt(b, "head", r.Head)
	b = kvInt(b, "min_seq", r.MinSeq)
	b = kvInt(b, "upto", r.Upto)
	b = kvBool(b, "more", r.More)
	return appendEvents(b, "events", r.Events)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r SyncOK) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// AckOK answers ack with the merged delivery cursor.
type AckOK struct {
	T         string `msgpack:"t"`
	Rid       string `msgpack:"rid"`
	Conv      string `msgpack:"conv"`
	Delivered int64  `msgpack:"delivered"`
}

func (r AckOK) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 4)
	b = kvStr(b, "t", orT(r.T, TAckOK))
	b = kvStr(b, "rid", r.Rid)
	b = kvStr(b, "conv", r.Conv)
	return kvInt(b, "delivered", r.Delivered)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r AckOK) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// ReadOK answers read with the merged read position and the unread count.
type ReadOK struct {
	T      string `msgpack:"t"`
	Rid    string `msgpack:"rid"`
	Conv   string `msgpack:"conv"`
	Read   int64  `msgpack:"read"`
	Unread int64  `msgpack:"unread"`
}

func (r ReadOK) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 5)
	b = kvStr(b, "t", orT(r.T, TReadOK))
	b = kvStr(b, "rid", r.Rid)
	b = kvStr(b, "conv", r.Conv)
	b = kvInt(b, "read", r.Read)
	return kvInt(b, "unread", r.Unread)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r ReadOK) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// ConvItem is one item of convs_ok.
type ConvItem struct {
	Conv      string `msgpack:"conv"`
	Kind      string `msgpack:"kind"`
	Title     string `msgpack:"title,omitempty"`
	Mode      string `msgpack:"mode"`
	Epoch     int64  `msgpack:"epoch"`
	Head      int64  `msgpack:"head"`
	MinSeq    int64  `msgpack:"min_seq"`
	Delivered int64  `msgpack:"delivered"`
	Read      int64  `msgpack:"read"`
	Cleared   int64  `msgpack:"cleared"`
	Unread    int64  `msgpack:"unread"`
	LastTs    int64  `msgpack:"last_ts"`
	// MutedUntil: the user's mute of the conversation (Unix ms; 0: not
	// muted), always written.
	MutedUntil int64 `msgpack:"muted_until"`
}

func (it ConvItem) appendMsgpack(b []byte) []byte { return it.appendTo(b) }

func (it *ConvItem) appendTo(b []byte) []byte {
	b = appendMapLen(b, 12+count(it.Title != ""))
	b = kvStr(b, "conv", it.Conv)
	b = kvStr(b, "kind", it.Kind)
	if it.Title != "" {
		b = kvStr(b, "title", it.Title)
	}
	b = kvStr(b, "mode", it.Mode)
	b = kvInt(b, "epoch", it.Epoch)
	b = kvInt(b, "head", it.Head)
	b = kvInt(b, "min_seq", it.MinSeq)
	b = kvInt(b, "delivered", it.Delivered)
	b = kvInt(b, "read", it.Read)
	b = kvInt(b, "cleared", it.Cleared)
	b = kvInt(b, "unread", it.Unread)
	b = kvInt(b, "last_ts", it.LastTs)
	return kvInt(b, "muted_until", it.MutedUntil)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (it ConvItem) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, it) }

// ConvsOK answers convs. Items is always written (an empty array when nil).
type ConvsOK struct {
	T      string     `msgpack:"t"`
	Rid    string     `msgpack:"rid"`
	Items  []ConvItem `msgpack:"items"`
	More   bool       `msgpack:"more"`
	Cursor string     `msgpack:"cursor,omitempty"`
}

func (r ConvsOK) appendMsgpack(b []byte) []byte { return r.appendTo(b) }

func (r *ConvsOK) appendTo(b []byte) []byte {
	b = appendMapLen(b, 4+count(r.Cursor != ""))
	b = kvStr(b, "t", orT(r.T, TConvsOK))
	b = kvStr(b, "rid", r.Rid)
	b = appendArrayLen(appendStr(b, "items"), len(r.Items))
	for i := range r.Items {
		b = r.Items[i].appendTo(b)
	}
	b = kvBool(b, "more", r.More)
	if r.Cursor != "" {
		b = kvStr(b, "cursor", r.Cursor)
	}
	return b
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r ConvsOK) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// SnapshotItem is one item of snapshot_ok. When Error is set (a code such as
// "NOT_MEMBER"), the other fields are zero.
type SnapshotItem struct {
	Conv    string  `msgpack:"conv"`
	Head    int64   `msgpack:"head"`
	Read    int64   `msgpack:"read"`
	Unread  int64   `msgpack:"unread"`
	Events  []Event `msgpack:"events"`
	Skipped int64   `msgpack:"skipped"`
	Error   string  `msgpack:"error,omitempty"`
}

func (it SnapshotItem) appendMsgpack(b []byte) []byte { return it.appendTo(b) }

func (it *SnapshotItem) appendTo(b []byte) []byte {
	b = appendMapLen(b, 6+count(it.Error != ""))
	b = kvStr(b, "conv", it.Conv)
	b = kvInt(b, "head", it.Head)
	b = kvInt(b, "read", it.Read)
	b = kvInt(b, "unread", it.Unread)
	b = appendEvents(b, "events", it.Events)
	b = kvInt(b, "skipped", it.Skipped)
	if it.Error != "" {
		b = kvStr(b, "error", it.Error)
	}
	return b
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (it SnapshotItem) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, it) }

// SnapshotOK answers snapshot, one item per requested conversation.
type SnapshotOK struct {
	T     string         `msgpack:"t"`
	Rid   string         `msgpack:"rid"`
	Items []SnapshotItem `msgpack:"items"`
}

func (r SnapshotOK) appendMsgpack(b []byte) []byte { return r.appendTo(b) }

func (r *SnapshotOK) appendTo(b []byte) []byte {
	b = appendMapLen(b, 3)
	b = kvStr(b, "t", orT(r.T, TSnapshotOK))
	b = kvStr(b, "rid", r.Rid)
	b = appendArrayLen(appendStr(b, "items"), len(r.Items))
	for i := range r.Items {
		b = r.Items[i].appendTo(b)
	}
	return b
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r SnapshotOK) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// RecallOK answers recall: Seq is the recall event's seq, Target the
// recalled message's.
type RecallOK struct {
	T      string `msgpack:"t"`
	Rid    string `msgpack:"rid"`
	Conv   string `msgpack:"conv"`
	Seq    int64  `msgpack:"seq"`
	Target int64  `msgpack:"target"`
}

func (r RecallOK) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 5)
	b = kvStr(b, "t", orT(r.T, TRecallOK))
	b = kvStr(b, "rid", r.Rid)
	b = kvStr(b, "conv", r.Conv)
	b = kvInt(b, "seq", r.Seq)
	return kvInt(b, "target", r.Target)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r RecallOK) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// EditOK answers edit: Seq is the edit event's seq, Target the edited
// message's.
type EditOK struct {
	T      string `msgpack:"t"`
	Rid    string `msgpack:"rid"`
	Conv   string `msgpack:"conv"`
	Seq    int64  `msgpack:"seq"`
	Target int64  `msgpack:"target"`
}

func (r EditOK) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 5)
	b = kvStr(b, "t", orT(r.T, TEditOK))
	b = kvStr(b, "rid", r.Rid)
	b = kvStr(b, "conv", r.Conv)
	b = kvInt(b, "seq", r.Seq)
	return kvInt(b, "target", r.Target)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r EditOK) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// ClearOK answers clear: the user's merged cleared and read positions and
// unread count.
type ClearOK struct {
	T       string `msgpack:"t"`
	Rid     string `msgpack:"rid"`
	Conv    string `msgpack:"conv"`
	Cleared int64  `msgpack:"cleared"`
	Read    int64  `msgpack:"read"`
	Unread  int64  `msgpack:"unread"`
}

func (r ClearOK) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 6)
	b = kvStr(b, "t", orT(r.T, TClearOK))
	b = kvStr(b, "rid", r.Rid)
	b = kvStr(b, "conv", r.Conv)
	b = kvInt(b, "cleared", r.Cleared)
	b = kvInt(b, "read", r.Read)
	return kvInt(b, "unread", r.Unread)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r ClearOK) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// Typing tells a device that user is typing in conv (relayed, never
// stored).
type Typing struct {
	T    string `msgpack:"t"`
	Conv string `msgpack:"conv"`
	User string `msgpack:"user"`
}

func (r Typing) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 3)
	b = kvStr(b, "t", orT(r.T, TTyping))
	b = kvStr(b, "conv", r.Conv)
	return kvStr(b, "user", r.User)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r Typing) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// UserRead is one member's read position (receipts_ok.reads).
type UserRead struct {
	User string `msgpack:"user"`
	Read int64  `msgpack:"read"`
}

// ReceiptsOK answers receipts: the current members' read positions (those
// of users with private receipts left out). Reads is always written.
type ReceiptsOK struct {
	T     string     `msgpack:"t"`
	Rid   string     `msgpack:"rid"`
	Conv  string     `msgpack:"conv"`
	Reads []UserRead `msgpack:"reads"`
}

func (r ReceiptsOK) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 4)
	b = kvStr(b, "t", orT(r.T, TReceiptsOK))
	b = kvStr(b, "rid", r.Rid)
	b = kvStr(b, "conv", r.Conv)
	b = appendArrayLen(appendStr(b, "reads"), len(r.Reads))
	for _, u := range r.Reads {
		b = appendMapLen(b, 2)
		b = kvStr(b, "user", u.User)
		b = kvInt(b, "read", u.Read)
	}
	return b
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r ReceiptsOK) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// SettingsOK answers settings with the user's settings after it.
type SettingsOK struct {
	T               string `msgpack:"t"`
	Rid             string `msgpack:"rid"`
	ReceiptsPrivate bool   `msgpack:"receipts_private"`
}

func (r SettingsOK) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 3)
	b = kvStr(b, "t", orT(r.T, TSettingsOK))
	b = kvStr(b, "rid", r.Rid)
	return kvBool(b, "receipts_private", r.ReceiptsPrivate)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r SettingsOK) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// Receipt tells a device that user's read position in conv advanced.
type Receipt struct {
	T    string `msgpack:"t"`
	Conv string `msgpack:"conv"`
	User string `msgpack:"user"`
	Read int64  `msgpack:"read"`
}

func (r Receipt) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 4)
	b = kvStr(b, "t", orT(r.T, TReceipt))
	b = kvStr(b, "conv", r.Conv)
	b = kvStr(b, "user", r.User)
	return kvInt(b, "read", r.Read)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r Receipt) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// Push carries one new event to a device (no rid): the event map,
// flattened beside t and conv, written by the event's own encoder.
type Push struct {
	T           string `msgpack:"t"`
	Conv        string `msgpack:"conv"`
	EventFields `msgpack:",inline"`
}

// PushOf returns the push frame for event ev of conversation conv.
func PushOf(conv string, ev *Event) Push {
	return Push{T: TPush, Conv: conv, EventFields: *ev}
}

// Event returns the event a push carries.
func (r *Push) Event() Event { return r.EventFields }

func (r Push) appendMsgpack(b []byte) []byte { return r.appendTo(b) }

// AppendFrame appends r as a frame to dst, as AppendFrame(dst, r) does,
// without r escaping to the heap (fan-out encodes every pushed event once,
// with this).
func (r *Push) AppendFrame(dst []byte) ([]byte, error) {
	start := len(dst)
	return finishFrame(r.appendTo(append(dst, 0, 0, 0, 0)), start)
}

func (r *Push) appendTo(b []byte) []byte {
	b = appendMapLen(b, 2+r.EventFields.fields())
	b = kvStr(b, "t", orT(r.T, TPush))
	b = kvStr(b, "conv", r.Conv)
	return r.EventFields.appendFields(b)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r Push) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// Hint tells a device it is behind in Conv and should sync it.
type Hint struct {
	T    string `msgpack:"t"`
	Conv string `msgpack:"conv"`
	Head int64  `msgpack:"head"`
}

func (r Hint) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 3)
	b = kvStr(b, "t", orT(r.T, THint))
	b = kvStr(b, "conv", r.Conv)
	return kvInt(b, "head", r.Head)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r Hint) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// ReadChanged tells a device that the user's read position advanced elsewhere.
type ReadChanged struct {
	T      string `msgpack:"t"`
	Conv   string `msgpack:"conv"`
	Read   int64  `msgpack:"read"`
	Unread int64  `msgpack:"unread"`
}

func (r ReadChanged) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 4)
	b = kvStr(b, "t", orT(r.T, TReadChanged))
	b = kvStr(b, "conv", r.Conv)
	b = kvInt(b, "read", r.Read)
	return kvInt(b, "unread", r.Unread)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r ReadChanged) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// Kick announces that the server closes the connection.
type Kick struct {
	T      string `msgpack:"t"`
	Reason string `msgpack:"reason"`
}

func (r Kick) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 2)
	b = kvStr(b, "t", orT(r.T, TKick))
	return kvStr(b, "reason", r.Reason)
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r Kick) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }

// ErrorFrame reports a failed request (rid echoed when the request had one).
type ErrorFrame struct {
	T            string `msgpack:"t"`
	Rid          string `msgpack:"rid,omitempty"`
	Code         Code   `msgpack:"code"`
	Msg          string `msgpack:"msg"`
	RetryAfterMs int64  `msgpack:"retry_after_ms,omitempty"`
}

// ErrorReply returns the error frame for e, echoing rid. RetryAfterMs is
// carried only for RATE_LIMITED.
func ErrorReply(rid string, e *Error) ErrorFrame {
	if e == nil {
		return ErrorFrame{T: TError, Rid: rid, Code: Internal, Msg: "unknown error"}
	}
	f := ErrorFrame{T: TError, Rid: rid, Code: e.Code, Msg: e.Msg}
	if e.Code == RateLimited {
		f.RetryAfterMs = e.RetryAfterMs
	}
	return f
}

// ErrorReplyFor is ErrorReply for any error: an *Error in err's chain is
// sent as is, anything else as INTERNAL with a generic message (the error's
// text stays on the server: it may name internals).
func ErrorReplyFor(rid string, err error) ErrorFrame {
	if e, ok := AsError(err); ok {
		return ErrorReply(rid, e)
	}
	return ErrorFrame{T: TError, Rid: rid, Code: Internal, Msg: "internal error"}
}

// Err returns the frame as an *Error.
func (r *ErrorFrame) Err() *Error {
	return &Error{Code: r.Code, Msg: r.Msg, RetryAfterMs: r.RetryAfterMs}
}

func (r ErrorFrame) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 3+count(r.Rid != "", r.RetryAfterMs != 0))
	b = kvStr(b, "t", orT(r.T, TError))
	if r.Rid != "" {
		b = kvStr(b, "rid", r.Rid)
	}
	b = kvStr(b, "code", string(r.Code))
	b = kvStr(b, "msg", r.Msg)
	if r.RetryAfterMs != 0 {
		b = kvInt(b, "retry_after_ms", r.RetryAfterMs)
	}
	return b
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r ErrorFrame) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, r) }
