package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"

	"github.com/vmihailenco/msgpack/v5"
)

// Request is every client→server frame, decoded. Fields absent in the frame
// are zero; Has tells which keys were present (a key whose value is msgpack
// nil counts as absent).
type Request struct {
	T, Rid          string
	Device, Token   string // auth with a static device token
	JWT             string // auth with a JSON Web Token, refresh
	Conv            string
	Cmid            string
	Kind            string // conv_create: "group" or "direct"
	Title           string
	Cursor          string
	Body            []byte // owns its memory (copied out of the input)
	Seq             int64
	After           int64
	Limit           int64
	Members         []string    // conv_create
	Users           []string    // members_add
	Convs           []ConvAfter // snapshot
	MentionAll      bool
	Mentions        []string // send
	Provider        string   // notify_register
	Sandbox         bool     // notify_register
	MutedUntil      int64    // conv_settings
	ReceiptsPrivate bool     // settings
	User            string   // role, member_mute, ban, unban
	Role            string   // role
	Invite          string   // conv_update
	Has             Field    // bit set of keys present
}

// ConvAfter is one element of snapshot.convs.
type ConvAfter struct {
	Conv  string `msgpack:"conv"`
	After int64  `msgpack:"after"`
}

// Field is a bit set of Request fields (one bit per key).
type Field uint32

// The Request fields, one bit each.
const (
	FRid Field = 1 << iota
	FDevice
	FToken
	FConv
	FCmid
	FKind
	FTitle
	FCursor
	FBody
	FSeq
	FAfter
	FLimit
	FMembers
	FUsers
	FConvs
	FMentionAll
	FMentions
	FProvider
	FSandbox
	FMutedUntil
	FReceiptsPrivate
	FJWT
	FUser
	FRole
	FInvite
)

var fieldNames = [...]string{
	"rid", "device", "token", "conv", "cmid", "kind", "title", "cursor",
	"body", "seq", "after", "limit", "members", "users", "convs", "mention_all",
	"mentions", "provider", "sandbox", "muted_until",
	"receipts_private",
	"jwt", "user", "role", "invite",
}

// String returns the wire names of the fields in f, separated by '|'.
func (f Field) String() string {
	s := ""
	for f != 0 {
		i := bits.TrailingZeros32(uint32(f))
		f &^= 1 << i
		if s != "" {
			s += "|"
		}
		if i < len(fieldNames) {
			s += fieldNames[i]
		} else {
			s += fmt.Sprintf("bit%d", i)
		}
	}
	return s
}

// fieldSpec tells, for a request type, which fields it requires and which it
// may carry.
type fieldSpec struct{ req, opt Field }

func specOf(t string) (fieldSpec, bool) {
	switch t {
	case TAuth:
		// Either device and token, or jwt (checked in decode).
		return fieldSpec{0, FRid | FDevice | FToken | FJWT}, true
	case TRefresh:
		return fieldSpec{FJWT, FRid}, true
	case TPing:
		return fieldSpec{0, FRid}, true
	case TConvCreate:
		return fieldSpec{FKind | FMembers, FRid | FConv | FTitle}, true
	case TMembersAdd:
		return fieldSpec{FConv | FUsers, FRid}, true
	case TLeave:
		return fieldSpec{FConv, FRid}, true
	case TSend:
		return fieldSpec{FConv | FCmid | FBody, FRid | FMentionAll | FMentions}, true
	case TSync:
		return fieldSpec{FConv | FAfter, FRid | FLimit}, true
	case TAck, TRead, TRecall, TClear:
		return fieldSpec{FConv | FSeq, FRid}, true
	case TEdit:
		return fieldSpec{FConv | FSeq | FBody, FRid}, true
	case TTyping, TReceipts:
		return fieldSpec{FConv, FRid}, true
	case TSettings:
		return fieldSpec{FReceiptsPrivate, FRid}, true
	case TConvs:
		return fieldSpec{0, FRid | FLimit | FCursor}, true
	case TSnapshot:
		return fieldSpec{FConvs, FRid}, true
	case TNotifyRegister:
		return fieldSpec{FProvider | FToken, FRid | FSandbox}, true
	case TNotifyUnregister:
		return fieldSpec{0, FRid}, true
	case TConvSettings:
		return fieldSpec{FConv | FMutedUntil, FRid}, true
	case TRole:
		return fieldSpec{FConv | FUser | FRole, FRid}, true
	case TMembersRemove:
		return fieldSpec{FConv | FUsers, FRid}, true
	case TMemberMute:
		return fieldSpec{FConv | FUser | FMutedUntil, FRid}, true
	case TBan, TUnban:
		return fieldSpec{FConv | FUser, FRid}, true
	case TConvUpdate:
		return fieldSpec{FConv, FRid | FTitle | FInvite}, true
	}
	return fieldSpec{}, false
}

// requestType returns the constant for a client request type name (so
// decoding `t` never allocates), or "" if name is not one.
func requestType(name []byte) string {
	switch string(name) {
	case TAuth:
		return TAuth
	case TPing:
		return TPing
	case TConvCreate:
		return TConvCreate
	case TMembersAdd:
		return TMembersAdd
	case TLeave:
		return TLeave
	case TSend:
		return TSend
	case TSync:
		return TSync
	case TAck:
		return TAck
	case TRead:
		return TRead
	case TConvs:
		return TConvs
	case TSnapshot:
		return TSnapshot
	case TRecall:
		return TRecall
	case TNotifyRegister:
		return TNotifyRegister
	case TNotifyUnregister:
		return TNotifyUnregister
	case TConvSettings:
		return TConvSettings
	case TEdit:
		return TEdit
	case TClear:
		return TClear
	case TTyping:
		return TTyping
	case TReceipts:
		return TReceipts
	case TSettings:
		return TSettings
	case TRefresh:
		return TRefresh
	case TRole:
		return TRole
	case TMembersRemove:
		return TMembersRemove
	case TMemberMute:
		return TMemberMute
	case TBan:
		return TBan
	case TUnban:
		return TUnban
	case TConvUpdate:
		return TConvUpdate
	}
	return ""
}

// prealloc caps slice preallocation from a claimed element count.
const prealloc = 64

func wrongType(field string, cl uint8) *Error {
	return &Error{Code: BadRequest, Msg: field + ": wrong type (" + classNames[cl] + ")"}
}

// DecodeRequest decodes one frame body (without the length prefix) from an
// untrusted client. It never panics, never allocates more than a small
// multiple of len(b), and returns an *Error:
//
//   - BAD_FRAME: undecodable msgpack (truncated, invalid, trailing bytes,
//     nesting deeper than 32), not a map, a non-string key, `t` missing / not
//     a string / not a client request type.
//   - BAD_REQUEST: a known field of the wrong type (a float that is not an
//     exact integer, for an integer field), a negative or out-of-range
//     seq/after/limit/muted_until, a missing or empty required field (auth: device, token;
//     conv_create: kind ("group"|"direct"), members; members_add: conv, users;
//     leave: conv; send: conv, cmid, body; sync: conv, after; ack, read,
//     recall, clear: conv, seq; edit: conv, seq, body; typing, receipts:
//     conv; settings: receipts_private; snapshot: convs with a conv and an after in every
//     element; role: conv, user, role ("owner"|"admin"|"member");
//     members_remove: conv, users; member_mute: conv, user, muted_until;
//     ban, unban: conv, user; conv_update: conv and a title or an invite
//     ("all"|"admins")). Msg names the field.
//
// On error the returned Request carries T (when it is a valid type) and Rid
// (when it decoded as a string), so the error reply can echo rid. Unknown
// keys are skipped; a nil value counts as absent; `body` may be bin or str
// and is copied; integers may have any msgpack width, or be a float32 or
// float64 that holds an exact integer.
func DecodeRequest(b []byte) (Request, error) {
	var q Request
	if err := q.decode(b); err != nil {
		return Request{T: q.T, Rid: q.Rid, Has: q.Has & FRid}, err
	}
	return q, nil
}

func (q *Request) decode(b []byte) *Error {
	r := reader{b: b}
	if r.peek() != clMap {
		if len(b) == 0 {
			return errTruncated
		}
		return &Error{Code: BadFrame, Msg: "frame is not a map (" + classNames[r.peek()] + ")"}
	}
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	var (
		fieldErr *Error // first BAD_REQUEST found; reported only if t is valid
		tRaw     []byte
		tSeen    bool
		tClass   uint8
	)
	for ; n > 0; n-- {
		if r.peek() != clStr {
			if r.off >= len(b) {
				return errTruncated
			}
			return &Error{Code: BadFrame, Msg: "map key is not a string (" + classNames[r.peek()] + ")"}
		}
		key, err := r.raw()
		if err != nil {
			return err
		}
		cl := r.peek()
		if cl == clInvalid {
			if r.off >= len(b) {
				return errTruncated
			}
			return errInvalid
		}
		if cl == clNil {
			// nil counts as absent
			r.off++
			continue
		}
		if string(key) == "t" {
			tSeen, tClass = true, cl
			if cl == clStr {
				if tRaw, err = r.raw(); err != nil {
					return err
				}
				continue
			}
			if err := r.skip(2); err != nil {
				return err
			}
			continue
		}
		start := r.off
		ferr := q.field(&r, key, cl)
		if ferr == nil {
			continue
		}
		if ferr.Code == BadFrame {
			return ferr
		}
		// A known field of the wrong type: remember the first such error and
		// skip the whole value, so that a bad `t` later still wins.
		if fieldErr == nil {
			fieldErr = ferr
		}
		r.off = start
		if err := r.skip(2); err != nil {
			return err
		}
	}
	if r.off != len(b) {
		return &Error{Code: BadFrame, Msg: "trailing bytes after the map"}
	}
	if !tSeen {
		return &Error{Code: BadFrame, Msg: "t: missing"}
	}
	if tClass != clStr {
		return &Error{Code: BadFrame, Msg: "t: not a string (" + classNames[tClass] + ")"}
	}
	q.T = requestType(tRaw)
	if q.T == "" {
		return &Error{Code: BadFrame, Msg: fmt.Sprintf("t: unknown frame type %.40q", tRaw)}
	}
	if fieldErr != nil {
		return fieldErr
	}
	spec, _ := specOf(q.T)
	if missing := spec.req &^ q.Has; missing != 0 {
		i := bits.TrailingZeros32(uint32(missing))
		return &Error{Code: BadRequest, Msg: fieldNames[i] + ": missing"}
	}
	switch q.T {
	case TAuth:
		switch {
		case q.Has&FJWT != 0 && q.Has&(FDevice|FToken) != 0:
			return &Error{Code: BadRequest, Msg: "jwt: not together with device and token"}
		case q.Has&FJWT != 0:
			if q.JWT == "" {
				return &Error{Code: BadRequest, Msg: "jwt: empty"}
			}
		case q.Has&FDevice == 0:
			return &Error{Code: BadRequest, Msg: "device: missing"}
		case q.Has&FToken == 0:
			return &Error{Code: BadRequest, Msg: "token: missing"}
		case q.Device == "":
			return &Error{Code: BadRequest, Msg: "device: empty"}
		}
	case TRefresh:
		if q.JWT == "" {
			return &Error{Code: BadRequest, Msg: "jwt: empty"}
		}
	case TConvCreate:
		if q.Kind != ConvGroup && q.Kind != ConvDirect {
			return &Error{Code: BadRequest, Msg: `kind: must be "group" or "direct"`}
		}
	case TSend:
		if q.Cmid == "" {
			return &Error{Code: BadRequest, Msg: "cmid: empty"}
		}
		if len(q.Mentions) > MaxMentions {
			return &Error{Code: BadRequest, Msg: fmt.Sprintf("mentions: more than %d users", MaxMentions)}
		}
	case TNotifyRegister:
		switch q.Provider {
		case ProviderAPNs, ProviderFCM, ProviderWebhook:
		default:
			return &Error{Code: BadRequest, Msg: fmt.Sprintf("provider: unknown provider %.40q (apns, fcm or webhook)", q.Provider)}
		}
		if q.Token == "" {
			return &Error{Code: BadRequest, Msg: "token: empty"}
		}
		if len(q.Token) > MaxNotifyToken {
			return &Error{Code: BadRequest, Msg: fmt.Sprintf("token: longer than %d bytes", MaxNotifyToken)}
		}
	case TRole:
		if !ValidRole(q.Role) {
			return &Error{Code: BadRequest, Msg: `role: must be "owner", "admin" or "member"`}
		}
	case TConvUpdate:
		if q.Has&(FTitle|FInvite) == 0 {
			return &Error{Code: BadRequest, Msg: "title or invite: missing"}
		}
		if q.Has&FInvite != 0 && !ValidInvite(q.Invite) {
			return &Error{Code: BadRequest, Msg: `invite: must be "all" or "admins"`}
		}
	}
	if spec.req&FUser != 0 && q.User == "" {
		return &Error{Code: BadRequest, Msg: "user: empty"}
	}
	if spec.req&FConv != 0 && q.Conv == "" {
		return &Error{Code: BadRequest, Msg: "conv: empty"}
	}
	return nil
}

// field decodes the value of one known key (cl is its class, never nil).
// It returns nil, a BAD_REQUEST (wrong type: the caller skips the value), or
// a BAD_FRAME (structural: decoding stops).
func (q *Request) field(r *reader, key []byte, cl uint8) *Error {
	switch string(key) {
	case "rid":
		return q.str(r, cl, FRid, &q.Rid)
	case "device":
		return q.str(r, cl, FDevice, &q.Device)
	case "token":
		return q.str(r, cl, FToken, &q.Token)
	case "jwt":
		return q.str(r, cl, FJWT, &q.JWT)
	case "conv":
		return q.str(r, cl, FConv, &q.Conv)
	case "cmid":
		return q.str(r, cl, FCmid, &q.Cmid)
	case "kind":
		if cl == clStr {
			p, err := r.raw()
			if err != nil {
				return err
			}
			switch string(p) { // intern the valid values
			case ConvGroup:
				q.Kind = ConvGroup
			case ConvDirect:
				q.Kind = ConvDirect
			default:
				q.Kind = string(p)
			}
			q.Has |= FKind
			return nil
		}
		return wrongType("kind", cl)
	case "title":
		return q.str(r, cl, FTitle, &q.Title)
	case "cursor":
		return q.str(r, cl, FCursor, &q.Cursor)
	case "body":
		if cl == clBin || cl == clStr {
			p, err := r.raw()
			if err != nil {
				return err
			}
			q.Body = append(make([]byte, 0, len(p)), p...)
			q.Has |= FBody
			return nil
		}
		return wrongType("body", cl)
	case "seq":
		return q.nonNeg(r, cl, FSeq, &q.Seq)
	case "after":
		return q.nonNeg(r, cl, FAfter, &q.After)
	case "limit":
		return q.nonNeg(r, cl, FLimit, &q.Limit)
	case "members":
		return q.strs(r, cl, FMembers, &q.Members)
	case "users":
		return q.strs(r, cl, FUsers, &q.Users)
	case "convs":
		return q.convs(r, cl)
	case "mention_all":
		return q.boolean(r, cl, FMentionAll, &q.MentionAll)
	case "mentions":
		return q.strs(r, cl, FMentions, &q.Mentions)
	case "provider":
		return q.str(r, cl, FProvider, &q.Provider)
	case "sandbox":
		return q.boolean(r, cl, FSandbox, &q.Sandbox)
	case "muted_until":
		return q.nonNeg(r, cl, FMutedUntil, &q.MutedUntil)
	case "receipts_private":
		return q.boolean(r, cl, FReceiptsPrivate, &q.ReceiptsPrivate)
	case "user":
		return q.str(r, cl, FUser, &q.User)
	case "role":
		return q.str(r, cl, FRole, &q.Role)
	case "invite":
		return q.str(r, cl, FInvite, &q.Invite)
	}
	return r.skip(2)
}

func fieldName(f Field) string { return fieldNames[bits.TrailingZeros32(uint32(f))] }

func (q *Request) str(r *reader, cl uint8, f Field, dst *string) *Error {
	if cl != clStr {
		return wrongType(fieldName(f), cl)
	}
	p, err := r.raw()
	if err != nil {
		return err
	}
	*dst = string(p)
	q.Has |= f
	return nil
}

func (q *Request) boolean(r *reader, cl uint8, f Field, dst *bool) *Error {
	if cl != clBool {
		return wrongType(fieldName(f), cl)
	}
	*dst = r.b[r.off] == 0xc3
	r.off++
	q.Has |= f
	return nil
}

func (q *Request) nonNeg(r *reader, cl uint8, f Field, dst *int64) *Error {
	v, bad, err := nonNegInt(r, cl)
	if err != nil {
		return err
	}
	if bad != "" {
		return &Error{Code: BadRequest, Msg: fieldName(f) + ": " + bad}
	}
	*dst = v
	q.Has |= f
	return nil
}

// nonNegInt reads the value of an integer field (cl is its class): a
// msgpack integer of any width, or a float32 or float64 that holds an
// exact integer (JavaScript's encoders write numbers such as Unix
// milliseconds as float64), that is at least 0 and fits an int64. For
// anything else, bad says what is wrong with it (the field's BAD_REQUEST);
// err is a BAD_FRAME (truncated input).
func nonNegInt(r *reader, cl uint8) (v int64, bad string, err *Error) {
	switch cl {
	case clInt:
		var ok bool
		if v, ok, err = r.int(); err != nil {
			return 0, "", err
		} else if !ok {
			return 0, "out of range", nil
		}
	case clFloat:
		f, err := r.float()
		if err != nil {
			return 0, "", err
		}
		switch {
		case f != math.Trunc(f) || math.IsInf(f, 0): // NaN too: NaN != NaN
			return 0, "wrong type (float that is not an integer)", nil
		case f < -(1<<63) || f >= 1<<63:
			return 0, "out of range", nil
		}
		v = int64(f)
	default:
		return 0, "wrong type (" + classNames[cl] + ")", nil
	}
	if v < 0 {
		return 0, "negative", nil
	}
	return v, "", nil
}

// float reads a msgpack float32 or float64 (the next value's class is
// clFloat) as a float64.
func (r *reader) float() (float64, *Error) {
	n := 4
	if r.b[r.off] == 0xcb {
		n = 8
	}
	if r.rem() < 1+n {
		return 0, errTruncated
	}
	p := r.b[r.off+1 : r.off+1+n]
	r.off += 1 + n
	if n == 4 {
		return float64(math.Float32frombits(binary.BigEndian.Uint32(p))), nil
	}
	return math.Float64frombits(binary.BigEndian.Uint64(p)), nil
}

func (q *Request) strs(r *reader, cl uint8, f Field, dst *[]string) *Error {
	if cl != clArray {
		return wrongType(fieldName(f), cl)
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	out := make([]string, 0, min(n, prealloc))
	for i := 0; i < n; i++ {
		if ecl := r.peek(); ecl != clStr {
			return wrongType(fmt.Sprintf("%s[%d]", fieldName(f), i), ecl)
		}
		p, err := r.raw()
		if err != nil {
			return err
		}
		out = append(out, string(p))
	}
	*dst = out
	q.Has |= f
	return nil
}

func (q *Request) convs(r *reader, cl uint8) *Error {
	if cl != clArray {
		return wrongType("convs", cl)
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	out := make([]ConvAfter, 0, min(n, prealloc))
	for i := 0; i < n; i++ {
		if ecl := r.peek(); ecl != clMap {
			return wrongType(fmt.Sprintf("convs[%d]", i), ecl)
		}
		m, err := r.mapLen()
		if err != nil {
			return err
		}
		var ca ConvAfter
		hasConv, hasAfter := false, false
		for ; m > 0; m-- {
			if kcl := r.peek(); kcl != clStr {
				return wrongType(fmt.Sprintf("convs[%d] key", i), kcl)
			}
			k, err := r.raw()
			if err != nil {
				return err
			}
			vcl := r.peek()
			switch {
			case vcl == clNil:
				r.off++
			case string(k) == "conv":
				if vcl != clStr {
					return wrongType(fmt.Sprintf("convs[%d].conv", i), vcl)
				}
				p, err := r.raw()
				if err != nil {
					return err
				}
				ca.Conv = string(p)
				hasConv = true
			case string(k) == "after":
				v, bad, err := nonNegInt(r, vcl)
				if err != nil {
					return err
				}
				if bad != "" {
					return &Error{Code: BadRequest, Msg: fmt.Sprintf("convs[%d].after: %s", i, bad)}
				}
				ca.After = v
				hasAfter = true
			default:
				if err := r.skip(4); err != nil {
					return err
				}
			}
		}
		if !hasConv || ca.Conv == "" {
			return &Error{Code: BadRequest, Msg: fmt.Sprintf("convs[%d].conv: missing", i)}
		}
		if !hasAfter {
			return &Error{Code: BadRequest, Msg: fmt.Sprintf("convs[%d].after: missing", i)}
		}
		out = append(out, ca)
	}
	q.Convs = out
	q.Has |= FConvs
	return nil
}

// ---- encoding (client side) ----

// present returns the fields of q that are set: non-zero, or marked in Has.
func (q *Request) present() Field {
	f := q.Has
	set := func(c bool, b Field) {
		if c {
			f |= b
		}
	}
	set(q.Rid != "", FRid)
	set(q.Device != "", FDevice)
	set(q.Token != "", FToken)
	set(q.Conv != "", FConv)
	set(q.Cmid != "", FCmid)
	set(q.Kind != "", FKind)
	set(q.Title != "", FTitle)
	set(q.Cursor != "", FCursor)
	set(q.Body != nil, FBody)
	set(q.Seq != 0, FSeq)
	set(q.After != 0, FAfter)
	set(q.Limit != 0, FLimit)
	set(q.Members != nil, FMembers)
	set(q.Users != nil, FUsers)
	set(q.Convs != nil, FConvs)
	set(q.MentionAll, FMentionAll)
	set(q.Mentions != nil, FMentions)
	set(q.Provider != "", FProvider)
	set(q.Sandbox, FSandbox)
	set(q.MutedUntil != 0, FMutedUntil)
	set(q.ReceiptsPrivate, FReceiptsPrivate)
	set(q.JWT != "", FJWT)
	set(q.User != "", FUser)
	set(q.Role != "", FRole)
	set(q.Invite != "", FInvite)
	return f
}

// Fields returns the keys AppendFrame writes for q besides `t`: the fields
// its type requires (always, even when zero), plus
// the optional ones that are set (non-zero or marked in Has). For a type
// that is not a client request type, every set field is written.
func (q *Request) Fields() Field {
	spec, ok := specOf(q.T)
	if !ok {
		return q.present()
	}
	return spec.req | (spec.opt & q.present())
}

func (q Request) appendMsgpack(b []byte) []byte {
	fs := q.Fields()
	b = appendMapLen(b, 1+bits.OnesCount32(uint32(fs)))
	b = kvStr(b, "t", q.T)
	for f := fs; f != 0; {
		bit := Field(1) << bits.TrailingZeros32(uint32(f))
		f &^= bit
		b = appendStr(b, fieldName(bit))
		switch bit {
		case FRid:
			b = appendStr(b, q.Rid)
		case FDevice:
			b = appendStr(b, q.Device)
		case FToken:
			b = appendStr(b, q.Token)
		case FConv:
			b = appendStr(b, q.Conv)
		case FCmid:
			b = appendStr(b, q.Cmid)
		case FKind:
			b = appendStr(b, q.Kind)
		case FTitle:
			b = appendStr(b, q.Title)
		case FCursor:
			b = appendStr(b, q.Cursor)
		case FBody:
			b = appendBin(b, q.Body)
		case FSeq:
			b = appendInt(b, q.Seq)
		case FAfter:
			b = appendInt(b, q.After)
		case FLimit:
			b = appendInt(b, q.Limit)
		case FMembers:
			b = appendStrs(b, q.Members)
		case FUsers:
			b = appendStrs(b, q.Users)
		case FConvs:
			b = appendArrayLen(b, len(q.Convs))
			for _, c := range q.Convs {
				b = appendMapLen(b, 2)
				b = kvStr(b, "conv", c.Conv)
				b = kvInt(b, "after", c.After)
			}
		case FMentionAll:
			b = appendBool(b, q.MentionAll)
		case FMentions:
			b = appendStrs(b, q.Mentions)
		case FProvider:
			b = appendStr(b, q.Provider)
		case FSandbox:
			b = appendBool(b, q.Sandbox)
		case FMutedUntil:
			b = appendInt(b, q.MutedUntil)
		case FReceiptsPrivate:
			b = appendBool(b, q.ReceiptsPrivate)
		case FJWT:
			b = appendStr(b, q.JWT)
		case FUser:
			b = appendStr(b, q.User)
		case FRole:
			b = appendStr(b, q.Role)
		case FInvite:
			b = appendStr(b, q.Invite)
		}
	}
	return b
}

// EncodeMsgpack implements msgpack.CustomEncoder: it writes `t`, then the
// keys listed by Fields.
func (q Request) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, q) }

// DecodeMsgpack implements msgpack.CustomDecoder with DecodeRequest.
func (q *Request) DecodeMsgpack(d *msgpack.Decoder) error {
	raw, err := d.DecodeRaw()
	if err != nil {
		return err
	}
	v, err := DecodeRequest(raw)
	*q = v
	return err
}

// EncodeMsgpack implements msgpack.CustomEncoder ({conv, after}, both always).
func (c ConvAfter) EncodeMsgpack(e *msgpack.Encoder) error { return encodeCustom(e, c) }

func (c ConvAfter) appendMsgpack(b []byte) []byte {
	b = appendMapLen(b, 2)
	b = kvStr(b, "conv", c.Conv)
	return kvInt(b, "after", c.After)
}
