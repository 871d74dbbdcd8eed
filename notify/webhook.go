package notify

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// Webhook posts notifications as signed JSON to one URL
// (docs/notifications.md, "Webhook").
type Webhook struct {
	// Static after construction.
	url    string
	secret []byte
	client *http.Client
	now    func() time.Time
}

// NewWebhook returns the webhook provider posting to url, signing with
// secret.
func NewWebhook(url, secret string, client *http.Client) *Webhook {
	return &Webhook{url: url, secret: []byte(secret), client: client, now: time.Now}
}

// Name implements Provider.
func (w *Webhook) Name() string { return "webhook" }

// WebhookPayload is the JSON body of a webhook notification.
type WebhookPayload struct {
	Device  string `json:"device"`
	User    string `json:"user"`
	Token   string `json:"token"`
	Conv    string `json:"conv,omitempty"`
	Seq     int64  `json:"seq,omitempty"`
	Kind    string `json:"kind"`
	Sender  string `json:"sender,omitempty"`
	Count   int64  `json:"count,omitempty"`
	Badge   int64  `json:"badge"`
	Title   string `json:"title,omitempty"`
	Preview string `json:"preview,omitempty"`
	Target  int64  `json:"target,omitempty"`
	Ts      int64  `json:"ts"`
}

// Webhook headers.
const (
	HeaderSignature   = "Parley-Signature"
	HeaderTimestamp   = "Parley-Timestamp"
	HeaderIdempotency = "Parley-Idempotency-Key"
)

// Sign returns the Parley-Signature value of body sent at timestamp (Unix
// seconds, as in Parley-Timestamp): "sha256=" and the hex HMAC-SHA256,
// keyed with secret, of timestamp + "." + body.
func Sign(secret []byte, timestamp string, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(timestamp))
	m.Write([]byte("."))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Send implements Provider: 2xx is success, 410 a token that is gone.
func (w *Webhook) Send(ctx context.Context, n *Notification) error {
	body, err := json.Marshal(WebhookPayload{Device: n.Device, User: n.User, Token: n.Token, Conv: n.Conv, Seq: n.Seq,
		Kind: n.Kind, Sender: n.Sender, Count: n.Count, Badge: n.Badge, Title: n.Title, Preview: n.Preview,
		Target: n.Target, Ts: n.Ts})
	if err != nil {
		return &SendError{Reason: ReasonRejected, Detail: err.Error()}
	}
	ts := strconv.FormatInt(w.now().Unix(), 10)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return &SendError{Reason: ReasonRejected, Detail: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, Sign(w.secret, ts, body))
	req.Header.Set(HeaderIdempotency, n.Key)
	resp, err := w.client.Do(req)
	if err != nil {
		return fmt.Errorf("notify: webhook: %w", err)
	}
	defer resp.Body.Close()
	detail, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	switch {
	case resp.StatusCode/100 == 2:
		return nil
	case resp.StatusCode == http.StatusGone:
		return &SendError{Reason: ReasonBadToken, Status: resp.StatusCode, Detail: string(detail)}
	}
	return statusError(resp, string(detail))
}
