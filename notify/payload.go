package notify

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The push services' limits (docs/notifications.md, "What each provider
// is sent").
const (
	// apnsPayloadMax: Apple refuses an alert or background push whose
	// JSON payload is longer (413 PayloadTooLarge).
	apnsPayloadMax = 4096
	// apnsCollapseIDMax: Apple refuses a longer apns-collapse-id (400
	// BadCollapseId).
	apnsCollapseIDMax = 64
	// fcmDataMax: FCM refuses a message whose data keys and values
	// together are longer (400 INVALID_ARGUMENT).
	fcmDataMax = 4096
	// fcmAPNsReserve: through FCM, an Apple device's APNs payload holds
	// the data keys besides aps, and keys FCM adds itself
	// (gcm.message_id, google.c.*): that payload is kept this much under
	// apnsPayloadMax.
	fcmAPNsReserve = 256
	// fcmTTLMax: FCM keeps a message for 4 weeks at most and refuses a
	// longer ttl.
	fcmTTLMax = 28 * 24 * time.Hour
)

// ellipsis ends a title or preview that was cut to fit a payload.
const ellipsis = "…"

// cutUTF8 returns the longest prefix of s of at most n bytes that does
// not split a UTF-8 character.
func cutUTF8(s string, n int) string {
	if n >= len(s) {
		return s
	}
	if n <= 0 {
		return ""
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// clip is s cut to at most keep bytes on a character boundary and ended
// with the ellipsis; s itself when it is not longer.
func clip(s string, keep int) string {
	if keep >= len(s) {
		return s
	}
	return cutUTF8(s, keep) + ellipsis
}

// longest is the longest clip of s for which fits holds (fits must hold
// for shorter clips whenever it holds for a longer one), or "" if none
// does: a binary search over the kept length, a dozen tries for a few
// kilobytes.
func longest(s string, fits func(string) bool) string {
	if fits(s) {
		return s
	}
	lo, hi := 0, len(s)-1 // the longest keep that fits is in [lo, hi], if any
	if !fits(clip(s, 0)) {
		return ""
	}
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if fits(clip(s, mid)) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return clip(s, lo)
}

// fitText cuts the title, then the preview, as little as needed for over
// (how many bytes the payload made with them exceeds its limit by; <= 0
// when it fits) to say the payload fits: each is cut on a character
// boundary and ends with "…". ok is false when the payload does not fit
// even without them.
func fitText(title, preview string, over func(title, preview string) int) (string, string, bool) {
	title = strings.ToValidUTF8(title, "\uFFFD")
	preview = strings.ToValidUTF8(preview, "\uFFFD")
	if over(title, preview) <= 0 {
		return title, preview, true
	}
	title = longest(title, func(t string) bool { return over(t, preview) <= 0 })
	if over(title, preview) <= 0 {
		return title, preview, true
	}
	preview = longest(preview, func(p string) bool { return over("", p) <= 0 })
	return "", preview, over("", preview) <= 0
}

// marshal is compact JSON without HTML escaping (a '<' in a preview
// stays one byte of the payload instead of six).
func marshal(v any) []byte {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	_ = e.Encode(v) // maps of strings and numbers only
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// apnsCollapseID is the apns-collapse-id of a conversation's
// notifications: the conversation id when it is at most 64 bytes of
// printable ASCII, otherwise "{", the unpadded base64url SHA-256 of the
// id and "}" (45 bytes; conversation ids never hold braces, so the two
// forms never meet).
func apnsCollapseID(conv string) string {
	plain := len(conv) <= apnsCollapseIDMax
	for i := 0; plain && i < len(conv); i++ {
		plain = conv[i] >= 0x20 && conv[i] < 0x7f
	}
	if plain {
		return conv
	}
	h := sha256.Sum256([]byte(conv))
	return "{" + base64.RawURLEncoding.EncodeToString(h[:]) + "}"
}

// apnsPush is a notification as Apple takes it, whether Parley sends it
// to APNs itself or through FCM: the push type, priority and collapse id
// of its kind and the aps dictionary.
//
//   - msg: an alert (priority 10) with aps.alert, aps.badge, aps.sound
//     and aps.thread-id, collapsed per conversation;
//   - badge: an alert push carrying only aps.badge (Apple's badge-only
//     update), priority 5: it interrupts nobody, and it is not a
//     background push, so it is neither throttled nor needs the app;
//   - recall: a background push (aps holds only content-available: 1,
//     priority 5, as Apple requires) that wakes the app to withdraw the
//     alert; Apple throttles these to a few an hour.
type apnsPush struct {
	pushType, priority, collapseID string
	aps                            map[string]any
}

func apnsPushOf(n *Notification) apnsPush {
	switch n.Kind {
	case KindMsg:
		title := n.Title
		if title == "" {
			title = n.Sender
		}
		body := n.Preview
		if body == "" {
			body = "New message"
			if n.Count > 1 {
				body = strconv.FormatInt(n.Count, 10) + " new messages"
			}
		}
		return apnsPush{pushType: "alert", priority: "10", collapseID: apnsCollapseID(n.Conv), aps: map[string]any{
			"alert": map[string]string{"title": title, "body": body}, "badge": n.Badge, "sound": "default", "thread-id": n.Conv}}
	case KindBadge:
		return apnsPush{pushType: "alert", priority: "5", aps: map[string]any{"badge": n.Badge}}
	default: // KindRecall
		return apnsPush{pushType: "background", priority: "5", aps: map[string]any{"content-available": 1}}
	}
}

// expiry is when a notification stops being worth delivering: ttl after
// its commit (n.Ts), whichever attempt this is; a notification without
// a commit time counts from now.
func expiry(n *Notification, ttl time.Duration, now time.Time) time.Time {
	if n.Ts <= 0 {
		return now.Add(ttl)
	}
	return time.UnixMilli(n.Ts).Add(ttl)
}

// apnsExpiration is the apns-expiration value for a notification that
// expires at exp: Unix seconds, or "0" (deliver now or never, do not
// store) when it is already due.
func apnsExpiration(exp, now time.Time) string {
	if exp.Unix() <= now.Unix() {
		return "0"
	}
	return strconv.FormatInt(exp.Unix(), 10)
}
