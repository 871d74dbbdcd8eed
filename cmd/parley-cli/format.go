package main

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/parley-im/parley/wire"
)

// ---- JSON shapes (field names as in docs/protocol.md) ----

// jsonEvent is an event. A msg's body is a string when it is valid UTF-8,
// otherwise body_b64 holds it base64-encoded.
type jsonEvent struct {
	Seq      int64    `json:"seq"`
	Kind     string   `json:"kind"`
	Sender   string   `json:"sender"`
	Body     *string  `json:"body,omitempty"`
	BodyB64  string   `json:"body_b64,omitempty"`
	Ts       int64    `json:"ts"`
	Cmid     string   `json:"cmid,omitempty"`
	Recalled bool     `json:"recalled,omitempty"`
	Target   int64    `json:"target,omitempty"`
	Users    []string `json:"users,omitempty"`
	Mentions []string `json:"mentions,omitempty"`
	Edited   int64    `json:"edited,omitempty"`
	// An update event's changes (docs/protocol.md §9).
	Role       string  `json:"role,omitempty"`
	MutedUntil *int64  `json:"muted_until,omitempty"`
	Banned     *bool   `json:"banned,omitempty"`
	Title      *string `json:"title,omitempty"`
	Invite     string  `json:"invite,omitempty"`
}

func eventJSON(ev wire.Event) jsonEvent {
	j := jsonEvent{Seq: ev.Seq, Kind: ev.Kind, Sender: ev.Sender, Ts: ev.Ts, Cmid: ev.Cmid,
		Recalled: ev.Recalled, Target: ev.Target, Users: ev.Users, Mentions: ev.Mentions, Edited: ev.Edited,
		Role: ev.Role, MutedUntil: ev.MutedUntil, Banned: ev.Banned, Title: ev.Title, Invite: ev.Invite}
	if ev.Kind == wire.KindMsg || len(ev.Body) > 0 {
		if utf8.Valid(ev.Body) {
			s := string(ev.Body)
			j.Body = &s
		} else {
			j.BodyB64 = base64.StdEncoding.EncodeToString(ev.Body)
		}
	}
	return j
}

func eventsJSON(evs []wire.Event) []jsonEvent {
	out := make([]jsonEvent, 0, len(evs))
	for _, ev := range evs {
		out = append(out, eventJSON(ev))
	}
	return out
}

// pushJSON is one line of watch -json: an event as a push frame carries it.
type pushJSON struct {
	T    string `json:"t"`
	Conv string `json:"conv"`
	jsonEvent
}

// The other lines of watch -json, as the server sends them.
type (
	hintJSON struct {
		T    string `json:"t"`
		Conv string `json:"conv"`
		Head int64  `json:"head"`
	}
	readChangedJSON struct {
		T      string `json:"t"`
		Conv   string `json:"conv"`
		Read   int64  `json:"read"`
		Unread int64  `json:"unread"`
	}
	kickJSON struct {
		T      string `json:"t"`
		Reason string `json:"reason"`
	}
	// memberJSON is a typing or receipt frame.
	memberJSON struct {
		T    string `json:"t"`
		Conv string `json:"conv"`
		User string `json:"user"`
		Read int64  `json:"read,omitempty"`
	}
)

type convJSON struct {
	Conv      string `json:"conv"`
	Kind      string `json:"kind"`
	Title     string `json:"title,omitempty"`
	Mode      string `json:"mode"`
	Epoch     int64  `json:"epoch"`
	Head      int64  `json:"head"`
	MinSeq    int64  `json:"min_seq"`
	Delivered int64  `json:"delivered"`
	Read      int64  `json:"read"`
	Cleared   int64  `json:"cleared"`
	Unread    int64  `json:"unread"`
	LastTs    int64  `json:"last_ts"`
}

type snapshotItemJSON struct {
	Conv    string      `json:"conv"`
	Head    int64       `json:"head"`
	Read    int64       `json:"read"`
	Unread  int64       `json:"unread"`
	Events  []jsonEvent `json:"events"`
	Skipped int64       `json:"skipped"`
	Error   string      `json:"error,omitempty"`
}

// errorJSON is what -json prints when a command fails.
type errorJSON struct {
	Error        string `json:"error"`
	Msg          string `json:"msg"`
	RetryAfterMs int64  `json:"retry_after_ms,omitempty"`
}

// ---- text ----

// formatEvent renders an event on one line:
//
//	[g1 #12 14:03:05] ana: hello
//	[g1 #13 14:03:09] * ana recalled #12
func formatEvent(conv string, ev wire.Event) string {
	prefix := fmt.Sprintf("[%s #%d %s] ", conv, ev.Seq, formatTs(ev.Ts, true))
	actor := ev.Sender
	if actor == "" {
		actor = "(admin)"
	}
	switch ev.Kind {
	case wire.KindMsg:
		switch {
		case ev.Recalled:
			return prefix + actor + ": (recalled)"
		case ev.Edited != 0:
			return prefix + actor + ": " + formatBody(ev.Body) + " (edited)"
		default:
			return prefix + actor + ": " + formatBody(ev.Body)
		}
	case wire.KindJoin:
		return prefix + fmt.Sprintf("* joined: %s (added by %s)", strings.Join(ev.Users, ", "), actor)
	case wire.KindLeave:
		if len(ev.Users) == 1 && ev.Users[0] == ev.Sender {
			return prefix + fmt.Sprintf("* left: %s", ev.Sender)
		}
		return prefix + fmt.Sprintf("* left: %s (removed by %s)", strings.Join(ev.Users, ", "), actor)
	case wire.KindRecall:
		return prefix + fmt.Sprintf("* %s recalled #%d", actor, ev.Target)
	case wire.KindEdit:
		return prefix + fmt.Sprintf("* %s edited #%d: %s", actor, ev.Target, formatBody(ev.Body))
	case wire.KindUpdate:
		return prefix + "* " + formatUpdate(actor, ev)
	}
	return prefix + fmt.Sprintf("* %s event from %s", ev.Kind, actor)
}

// formatUpdate describes an update event: "ana made ben admin", "ben
// muted cy until …", "ana set the title to "Trip", invite admins".
func formatUpdate(actor string, ev wire.Event) string {
	users := strings.Join(ev.Users, ", ")
	var what []string
	if ev.Role != "" {
		what = append(what, fmt.Sprintf("made %s %s", users, ev.Role))
	}
	if ev.MutedUntil != nil {
		if *ev.MutedUntil == 0 {
			what = append(what, "unmuted "+users)
		} else {
			what = append(what, fmt.Sprintf("muted %s until %s", users, formatTs(*ev.MutedUntil, false)))
		}
	}
	if ev.Banned != nil {
		if *ev.Banned {
			what = append(what, "banned "+users)
		} else {
			what = append(what, "unbanned "+users)
		}
	}
	if ev.Title != nil {
		what = append(what, fmt.Sprintf("set the title to %q", *ev.Title))
	}
	if ev.Invite != "" {
		what = append(what, "set invite to "+ev.Invite)
	}
	if len(what) == 0 {
		what = append(what, "updated the group")
	}
	return actor + " " + strings.Join(what, ", ")
}

// formatBody shows text as is and anything else escaped; binary bodies
// as their size.
func formatBody(b []byte) string {
	if !utf8.Valid(b) {
		return fmt.Sprintf("(%d bytes, not UTF-8)", len(b))
	}
	s := string(b)
	if strings.IndexFunc(s, func(r rune) bool { return unicode.IsControl(r) }) >= 0 {
		q := strconv.Quote(s)
		return q[1 : len(q)-1]
	}
	return s
}

// formatTs shows a Unix-millisecond time: the time of day for today
// (with seconds if secs), the date too otherwise.
func formatTs(ms int64, secs bool) string {
	if ms == 0 {
		return "-"
	}
	t := time.UnixMilli(ms)
	now := time.Now()
	if y, m, d := t.Date(); y == now.Year() && m == now.Month() && d == now.Day() {
		if secs {
			return t.Format("15:04:05")
		}
		return t.Format("15:04")
	}
	return t.Format("2006-01-02 15:04")
}

// traceFrame summarises a server frame for -trace.
func traceFrame(m wire.Message) string {
	switch m.T {
	case wire.TPush:
		return fmt.Sprintf("push %s #%d %s from %q", m.Conv, m.Seq, m.Kind, m.Sender)
	case wire.THint:
		return fmt.Sprintf("hint %s head %d", m.Conv, m.Head)
	case wire.TReadChanged:
		return fmt.Sprintf("read_changed %s read %d unread %d", m.Conv, m.Read, m.Unread)
	case wire.TKick:
		return "kick " + m.Reason
	case wire.TSyncOK:
		return fmt.Sprintf("sync_ok rid=%s %s head %d upto %d more %v, %d events", m.Rid, m.Conv, m.Head, m.Upto, m.More, len(m.Events))
	case wire.TSnapshotOK:
		return fmt.Sprintf("snapshot_ok rid=%s, %d items", m.Rid, len(m.Items))
	case wire.TConvsOK:
		return fmt.Sprintf("convs_ok rid=%s, %d items, more %v", m.Rid, len(m.Items), m.More)
	case wire.TSendOK:
		return fmt.Sprintf("send_ok rid=%s %s #%d dup %v", m.Rid, m.Conv, m.Seq, m.Dup)
	case wire.TAckOK:
		return fmt.Sprintf("ack_ok rid=%s %s delivered %d", m.Rid, m.Conv, m.Delivered)
	case wire.TAuthOK:
		return fmt.Sprintf("auth_ok rid=%s user %s device %s install_epoch %d", m.Rid, m.User, m.Device, m.InstallEpoch)
	}
	return m.String()
}

// traceRequest summarises a client frame for -trace (never the token).
func traceRequest(q wire.Request) string {
	switch q.T {
	case wire.TAuth:
		return fmt.Sprintf("auth rid=%s device %s", q.Rid, q.Device)
	case wire.TSync:
		return fmt.Sprintf("sync rid=%s %s after %d limit %d", q.Rid, q.Conv, q.After, q.Limit)
	case wire.TSnapshot:
		var b strings.Builder
		for i, c := range q.Convs {
			if i == 8 {
				fmt.Fprintf(&b, " …(%d)", len(q.Convs))
				break
			}
			fmt.Fprintf(&b, " %s:%d", c.Conv, c.After)
		}
		return fmt.Sprintf("snapshot rid=%s%s", q.Rid, b.String())
	case wire.TSend:
		return fmt.Sprintf("send rid=%s %s cmid %s, %d bytes", q.Rid, q.Conv, q.Cmid, len(q.Body))
	case wire.TAck, wire.TRead, wire.TRecall:
		return fmt.Sprintf("%s rid=%s %s %d", q.T, q.Rid, q.Conv, q.Seq)
	case wire.TPing, wire.TConvs:
		return fmt.Sprintf("%s rid=%s", q.T, q.Rid)
	}
	return fmt.Sprintf("%s rid=%s %s", q.T, q.Rid, q.Conv)
}
