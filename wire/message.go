package wire

import "fmt"

// Message is any server→client frame, decoded on the client side: the union
// of the fields of every reply and push type. T tells which fields are
// meaningful; absent fields are zero.
type Message struct {
	T               string     `msgpack:"t"`
	Rid             string     `msgpack:"rid,omitempty"`
	User            string     `msgpack:"user,omitempty"`
	Device          string     `msgpack:"device,omitempty"`
	InstallEpoch    int64      `msgpack:"install_epoch,omitempty"`
	Conv            string     `msgpack:"conv,omitempty"`
	Head            int64      `msgpack:"head,omitempty"`
	Dup             bool       `msgpack:"dup,omitempty"`
	Epoch           int64      `msgpack:"epoch,omitempty"`
	MinSeq          int64      `msgpack:"min_seq,omitempty"`
	Upto            int64      `msgpack:"upto,omitempty"`
	More            bool       `msgpack:"more,omitempty"`
	Events          []Event    `msgpack:"events,omitempty"`
	Delivered       int64      `msgpack:"delivered,omitempty"`
	Read            int64      `msgpack:"read,omitempty"`
	Unread          int64      `msgpack:"unread,omitempty"`
	Cleared         int64      `msgpack:"cleared,omitempty"`
	Reads           []UserRead `msgpack:"reads,omitempty"`
	ReceiptsPrivate bool       `msgpack:"receipts_private,omitempty"`
	Items           []Item     `msgpack:"items,omitempty"`
	Cursor          string     `msgpack:"cursor,omitempty"`
	Reason          string     `msgpack:"reason,omitempty"`
	Code            Code       `msgpack:"code,omitempty"`
	Msg             string     `msgpack:"msg,omitempty"`
	RetryAfterMs    int64      `msgpack:"retry_after_ms,omitempty"`
	ExpiresAt       int64      `msgpack:"expires_at,omitempty"`
	// EventFields: the keys of the event map (docs/protocol.md §3),
	// decoded by the same code as sync's and snapshot's events. A push
	// carries the event in them (Event returns it); other frames use some
	// of the keys for themselves: seq (send_ok, update_ok, recall_ok,
	// edit_ok), ts (auth_ok, pong, send_ok), cmid (send_ok), target
	// (recall_ok, edit_ok), muted_until (conv_settings_ok).
	EventFields `msgpack:",inline"`
}

// Item is one element of convs_ok.items or snapshot_ok.items: the union of
// ConvItem and SnapshotItem.
type Item struct {
	Conv       string  `msgpack:"conv"`
	Kind       string  `msgpack:"kind,omitempty"`
	Title      string  `msgpack:"title,omitempty"`
	Mode       string  `msgpack:"mode,omitempty"`
	Epoch      int64   `msgpack:"epoch,omitempty"`
	Head       int64   `msgpack:"head"`
	MinSeq     int64   `msgpack:"min_seq,omitempty"`
	Delivered  int64   `msgpack:"delivered,omitempty"`
	Read       int64   `msgpack:"read"`
	Cleared    int64   `msgpack:"cleared,omitempty"`
	Unread     int64   `msgpack:"unread"`
	LastTs     int64   `msgpack:"last_ts,omitempty"`
	MutedUntil int64   `msgpack:"muted_until,omitempty"`
	Events     []Event `msgpack:"events,omitempty"`
	Skipped    int64   `msgpack:"skipped,omitempty"`
	Error      string  `msgpack:"error,omitempty"`
}

// ConvItem returns the convs_ok view of it.
func (it *Item) ConvItem() ConvItem {
	return ConvItem{Conv: it.Conv, Kind: it.Kind, Title: it.Title, Mode: it.Mode,
		Epoch: it.Epoch, Head: it.Head, MinSeq: it.MinSeq, Delivered: it.Delivered,
		Read: it.Read, Cleared: it.Cleared, Unread: it.Unread, LastTs: it.LastTs, MutedUntil: it.MutedUntil}
}

// SnapshotItem returns the snapshot_ok view of it.
func (it *Item) SnapshotItem() SnapshotItem {
	return SnapshotItem{Conv: it.Conv, Head: it.Head, Read: it.Read, Unread: it.Unread,
		Events: it.Events, Skipped: it.Skipped, Error: it.Error}
}

// Err returns the error an `error` frame carries, or nil for any other frame.
func (m *Message) Err() *Error {
	if m.T != TError {
		return nil
	}
	return &Error{Code: m.Code, Msg: m.Msg, RetryAfterMs: m.RetryAfterMs}
}

// Event returns the event a `push` frame carries.
func (m *Message) Event() Event { return m.EventFields }

// DecodeMessage decodes one server→client frame body (without the length
// prefix). Every string and byte slice of the result owns its memory, so b
// may be reused afterwards. Unknown keys are skipped and nil values count as
// absent; any malformed input gives an *Error with code BAD_FRAME. Like
// DecodeRequest it never trusts a claimed length, so a hostile or broken
// server cannot make a client allocate more than a small multiple of len(b).
func DecodeMessage(b []byte) (Message, error) {
	var m Message
	r := reader{b: b}
	if err := m.decode(&r); err != nil {
		return m, err
	}
	if r.off != len(b) {
		return m, &Error{Code: BadFrame, Msg: "trailing bytes after the map"}
	}
	if m.T == "" {
		return m, &Error{Code: BadFrame, Msg: "t: missing"}
	}
	return m, nil
}

// typed readers for the client side: wrong types are BAD_FRAME.

func badField(name string, cl uint8) *Error {
	return &Error{Code: BadFrame, Msg: name + ": wrong type (" + classNames[cl] + ")"}
}

func (r *reader) getStr(name string, dst *string) *Error {
	if cl := r.peek(); cl != clStr {
		return badField(name, cl)
	}
	p, err := r.raw()
	if err == nil {
		*dst = string(p)
	}
	return err
}

func (r *reader) getInt(name string, dst *int64) *Error {
	if cl := r.peek(); cl != clInt {
		return badField(name, cl)
	}
	v, ok, err := r.int()
	if err != nil {
		return err
	}
	if !ok {
		return &Error{Code: BadFrame, Msg: name + ": out of range"}
	}
	*dst = v
	return nil
}

func (r *reader) getBool(name string, dst *bool) *Error {
	if cl := r.peek(); cl != clBool {
		return badField(name, cl)
	}
	*dst = r.b[r.off] == 0xc3
	r.off++
	return nil
}

func (r *reader) getBytes(name string, dst *[]byte) *Error {
	if cl := r.peek(); cl != clBin && cl != clStr {
		return badField(name, cl)
	}
	p, err := r.raw()
	if err == nil {
		*dst = append(make([]byte, 0, len(p)), p...)
	}
	return err
}

func (r *reader) getStrs(name string, dst *[]string) *Error {
	if cl := r.peek(); cl != clArray {
		return badField(name, cl)
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	out := make([]string, 0, min(n, prealloc))
	for ; n > 0; n-- {
		var s string
		if err := r.getStr(name, &s); err != nil {
			return err
		}
		out = append(out, s)
	}
	*dst = out
	return nil
}

// mapKeys iterates the string-keyed map at r, calling fn for every key whose
// value is not nil; fn must consume the value (or return an error).
func (r *reader) mapKeys(name string, depth int, fn func(key []byte) *Error) *Error {
	if depth > maxDepth {
		return errTooDeep
	}
	if cl := r.peek(); cl != clMap {
		if r.off >= len(r.b) {
			return errTruncated
		}
		return &Error{Code: BadFrame, Msg: name + ": not a map (" + classNames[cl] + ")"}
	}
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	for ; n > 0; n-- {
		if cl := r.peek(); cl != clStr {
			if r.off >= len(r.b) {
				return errTruncated
			}
			return &Error{Code: BadFrame, Msg: name + ": map key is not a string"}
		}
		k, err := r.raw()
		if err != nil {
			return err
		}
		switch r.peek() {
		case clNil:
			r.off++
			continue
		case clInvalid:
			if r.off >= len(r.b) {
				return errTruncated
			}
			return errInvalid
		}
		if err := fn(k); err != nil {
			return err
		}
	}
	return nil
}

func (r *reader) getEvents(name string, depth int, dst *[]Event) *Error {
	if cl := r.peek(); cl != clArray {
		return badField(name, cl)
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	out := make([]Event, 0, min(n, prealloc))
	for i := 0; i < n; i++ {
		out = append(out, Event{})
		if err := r.event(depth+1, &out[i]); err != nil {
			return err
		}
	}
	*dst = out
	return nil
}

func (r *reader) event(depth int, ev *Event) *Error {
	return r.mapKeys("event", depth, func(k []byte) *Error {
		if ok, err := ev.field(r, string(k)); ok {
			return err
		}
		return r.skip(depth + 1)
	})
}

// field decodes key k of the event map into ev: the one decoder of the
// event map, for the events of sync_ok and snapshot_ok and for push. ok is
// false for a key that is not one of Event's.
func (ev *Event) field(r *reader, k string) (ok bool, err *Error) {
	switch k {
	case "seq":
		return true, r.getInt("seq", &ev.Seq)
	case "kind":
		return true, r.getStr("kind", &ev.Kind)
	case "sender":
		return true, r.getStr("sender", &ev.Sender)
	case "body":
		return true, r.getBytes("body", &ev.Body)
	case "ts":
		return true, r.getInt("ts", &ev.Ts)
	case "cmid":
		return true, r.getStr("cmid", &ev.Cmid)
	case "recalled":
		return true, r.getBool("recalled", &ev.Recalled)
	case "target":
		return true, r.getInt("target", &ev.Target)
	case "users":
		return true, r.getStrs("users", &ev.Users)
	case "mentions":
		return true, r.getStrs("mentions", &ev.Mentions)
	case "edited":
		return true, r.getInt("edited", &ev.Edited)
	}
	return ev.Update.field(r, k)
}

func (r *reader) item(depth int, it *Item) *Error {
	return r.mapKeys("item", depth, func(k []byte) *Error {
		switch string(k) {
		case "conv":
			return r.getStr("conv", &it.Conv)
		case "kind":
			return r.getStr("kind", &it.Kind)
		case "title":
			return r.getStr("title", &it.Title)
		case "mode":
			return r.getStr("mode", &it.Mode)
		case "epoch":
			return r.getInt("epoch", &it.Epoch)
		case "head":
			return r.getInt("head", &it.Head)
		case "min_seq":
			return r.getInt("min_seq", &it.MinSeq)
		case "delivered":
			return r.getInt("delivered", &it.Delivered)
		case "read":
			return r.getInt("read", &it.Read)
		case "unread":
			return r.getInt("unread", &it.Unread)
		case "cleared":
			return r.getInt("cleared", &it.Cleared)
		case "last_ts":
			return r.getInt("last_ts", &it.LastTs)
		case "muted_until":
			return r.getInt("muted_until", &it.MutedUntil)
		case "events":
			return r.getEvents("events", depth+1, &it.Events)
		case "skipped":
			return r.getInt("skipped", &it.Skipped)
		case "error":
			return r.getStr("error", &it.Error)
		}
		return r.skip(depth + 1)
	})
}

func (m *Message) decode(r *reader) *Error {
	const depth = 1
	return r.mapKeys("frame", depth, func(k []byte) *Error {
		switch string(k) {
		case "t":
			if cl := r.peek(); cl != clStr {
				return badField("t", cl)
			}
			p, err := r.raw()
			if err != nil {
				return err
			}
			m.T = messageType(p)
			return nil
		case "rid":
			return r.getStr("rid", &m.Rid)
		case "user":
			return r.getStr("user", &m.User)
		case "device":
			return r.getStr("device", &m.Device)
		case "install_epoch":
			return r.getInt("install_epoch", &m.InstallEpoch)
		case "expires_at":
			return r.getInt("expires_at", &m.ExpiresAt)
		case "conv":
			return r.getStr("conv", &m.Conv)
		case "head":
			return r.getInt("head", &m.Head)
		case "dup":
			return r.getBool("dup", &m.Dup)
		case "epoch":
			return r.getInt("epoch", &m.Epoch)
		case "min_seq":
			return r.getInt("min_seq", &m.MinSeq)
		case "upto":
			return r.getInt("upto", &m.Upto)
		case "more":
			return r.getBool("more", &m.More)
		case "events":
			return r.getEvents("events", depth+1, &m.Events)
		case "delivered":
			return r.getInt("delivered", &m.Delivered)
		case "read":
			return r.getInt("read", &m.Read)
		case "unread":
			return r.getInt("unread", &m.Unread)
		case "cleared":
			return r.getInt("cleared", &m.Cleared)
		case "receipts_private":
			return r.getBool("receipts_private", &m.ReceiptsPrivate)
		case "reads":
			if cl := r.peek(); cl != clArray {
				return badField("reads", cl)
			}
			n, err := r.arrayLen()
			if err != nil {
				return err
			}
			out := make([]UserRead, 0, min(n, prealloc))
			for i := 0; i < n; i++ {
				var ur UserRead
				if err := r.mapKeys("reads item", depth+2, func(k []byte) *Error {
					switch string(k) {
					case "user":
						return r.getStr("user", &ur.User)
					case "read":
						return r.getInt("read", &ur.Read)
					}
					return r.skip(depth + 3)
				}); err != nil {
					return err
				}
				out = append(out, ur)
			}
			m.Reads = out
			return nil
		case "items":
			if cl := r.peek(); cl != clArray {
				return badField("items", cl)
			}
			n, err := r.arrayLen()
			if err != nil {
				return err
			}
			out := make([]Item, 0, min(n, prealloc))
			for i := 0; i < n; i++ {
				out = append(out, Item{})
				if err := r.item(depth+2, &out[i]); err != nil {
					return err
				}
			}
			m.Items = out
			return nil
		case "cursor":
			return r.getStr("cursor", &m.Cursor)
		case "reason":
			return r.getStr("reason", &m.Reason)
		case "code":
			var s string
			err := r.getStr("code", &s)
			m.Code = Code(s)
			return err
		case "msg":
			return r.getStr("msg", &m.Msg)
		case "retry_after_ms":
			return r.getInt("retry_after_ms", &m.RetryAfterMs)
		}
		if ok, err := m.EventFields.field(r, string(k)); ok {
			return err
		}
		return r.skip(depth + 1)
	})
}

// messageType returns the constant for a server frame type name (no
// allocation for the known ones).
func messageType(p []byte) string {
	switch string(p) {
	case TAuthOK:
		return TAuthOK
	case TPong:
		return TPong
	case TConvCreateOK:
		return TConvCreateOK
	case TMembersOK:
		return TMembersOK
	case TSendOK:
		return TSendOK
	case TSyncOK:
		return TSyncOK
	case TAckOK:
		return TAckOK
	case TReadOK:
		return TReadOK
	case TConvsOK:
		return TConvsOK
	case TSnapshotOK:
		return TSnapshotOK
	case TRecallOK:
		return TRecallOK
	case TEditOK:
		return TEditOK
	case TClearOK:
		return TClearOK
	case TReceiptsOK:
		return TReceiptsOK
	case TSettingsOK:
		return TSettingsOK
	case TTyping:
		return TTyping
	case TReceipt:
		return TReceipt
	case TRefreshOK:
		return TRefreshOK
	case TUpdateOK:
		return TUpdateOK
	case TPush:
		return TPush
	case THint:
		return THint
	case TReadChanged:
		return TReadChanged
	case TKick:
		return TKick
	case TError:
		return TError
	}
	return string(p)
}

// String summarises m for logs and test failures.
func (m *Message) String() string {
	switch m.T {
	case TError:
		return fmt.Sprintf("error rid=%q %s: %s", m.Rid, m.Code, m.Msg)
	case TPush:
		return fmt.Sprintf("push %s#%d %s from %q", m.Conv, m.Seq, m.Kind, m.Sender)
	}
	return fmt.Sprintf("%s rid=%q conv=%q", m.T, m.Rid, m.Conv)
}
