package notify

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Notification is one notification to one device, as every provider
// sends it: the data of docs/protocol.md §8 and where it goes.
type Notification struct {
	// Where.
	Device  string
	User    string
	Token   string
	Sandbox bool // APNs: the development environment
	// What (the data part).
	Conv    string
	Seq     int64
	Kind    string // "msg", "recall" or "badge"
	Sender  string
	Count   int64
	Badge   int64
	Title   string
	Preview string
	Target  int64 // recall: the recalled seq
	Ts      int64 // the commit ts of the (newest) event; for badge, when it was made
	// Key is the idempotency key: the same for every attempt at this
	// notification.
	Key string
	// RegisteredAt is when the device registered Token (Unix ms): APNs
	// reports since when a token is invalid, and a token registered
	// again after that is kept.
	RegisteredAt int64
}

// Data is the notification's data part as JSON-able values (string
// values, as FCM's data map requires).
func (n *Notification) Data() map[string]string {
	d := map[string]string{"kind": n.Kind, "badge": strconv.FormatInt(n.Badge, 10)}
	if n.Kind == KindBadge {
		return d
	}
	d["conv"], d["seq"] = n.Conv, strconv.FormatInt(n.Seq, 10)
	if n.Kind == KindRecall {
		d["target"] = strconv.FormatInt(n.Target, 10)
		return d
	}
	d["sender"], d["count"] = n.Sender, strconv.FormatInt(n.Count, 10)
	if n.Title != "" {
		d["title"] = n.Title
	}
	if n.Preview != "" {
		d["preview"] = n.Preview
	}
	return d
}

// Notification kinds.
const (
	KindMsg    = "msg"
	KindRecall = "recall"
	KindBadge  = "badge"
)

// Provider sends notifications through one push service.
type Provider interface {
	// Name is the provider's registration name: "apns", "fcm" or "webhook".
	Name() string
	// Send delivers n, or returns an error; a *SendError says what to do
	// about it (any other error is retried).
	Send(ctx context.Context, n *Notification) error
}

// Reasons a provider refused a notification (the reason label of the
// metrics).
const (
	ReasonBadToken    = "bad_token"   // the token is invalid: the registration is removed
	ReasonThrottled   = "throttled"   // 429: retried after Retry-After
	ReasonUnavailable = "unavailable" // 5xx or no answer: retried with backoff
	ReasonRejected    = "rejected"    // another 4xx: dropped
	// ReasonConfig: the provider refused the server's own configuration
	// (credentials, APNs topic, FCM project), not the device: the
	// notification is dropped, the registration kept, and the error
	// logged (docs/notifications.md, "Configuration errors").
	ReasonConfig = "config"
)

// SendError is a provider's refusal.
type SendError struct {
	Reason     string        // one of the Reason constants
	Status     int           // the HTTP status, if any
	RetryAfter time.Duration // from Retry-After, if any
	Detail     string
}

func (e *SendError) Error() string {
	return fmt.Sprintf("notify: %s (status %d): %s", e.Reason, e.Status, e.Detail)
}

// reasonOf classifies err (nil: sent).
func reasonOf(err error) (reason string, retryAfter time.Duration) {
	var se *SendError
	if errors.As(err, &se) {
		return se.Reason, se.RetryAfter
	}
	return ReasonUnavailable, 0
}

// statusError is the SendError of an HTTP status that the provider's own
// rules did not classify: 429 and 5xx are retried (honouring
// Retry-After), other statuses are dropped.
func statusError(resp *http.Response, detail string) *SendError {
	e := &SendError{Status: resp.StatusCode, Detail: detail, RetryAfter: retryAfter(resp.Header.Get("Retry-After"))}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		e.Reason = ReasonThrottled
	case resp.StatusCode >= 500:
		e.Reason = ReasonUnavailable
	default:
		e.Reason = ReasonRejected
	}
	return e
}

// retryAfter parses a Retry-After header: seconds or an HTTP date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// configLogEvery: a provider refusing the server's configuration refuses
// every notification; one log line a minute says so.
const configLogEvery = time.Minute

// configRefused logs a configuration error of provider, at most once per
// configLogEvery (parley_notify_dropped_total{reason="config"} counts
// every notification dropped for it).
func (n *Notifier) configRefused(provider string, err error) {
	p := n.providers[provider]
	if p == nil {
		return
	}
	now := time.Now().UnixNano()
	last := p.configLogged.Load()
	if now-last < int64(configLogEvery) || !p.configLogged.CompareAndSwap(last, now) {
		return
	}
	n.log.Error("the push provider refuses this server's configuration; notifications are dropped, registrations kept",
		"provider", provider, "err", err)
}
