package notify

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// APNsConfig is what the APNs provider needs (docs/notifications.md,
// "APNs").
type APNsConfig struct {
	Endpoint        string // production, e.g. https://api.push.apple.com
	SandboxEndpoint string // for registrations with sandbox: true
	KeyFile         string // the .p8 signing key
	KeyID           string
	TeamID          string
	Topic           string // the app's bundle id
	TTL             time.Duration
}

// Provider tokens: Apple refuses a token issued more than an hour ago
// (403 ExpiredProviderToken) and a connection whose token changes more
// than once in 20 minutes (429 TooManyProviderTokenUpdates). A token is
// used for apnsTokenLife, and remade early only when Apple says it
// expired and it is at least apnsTokenMinLife old.
const (
	apnsTokenLife    = 50 * time.Minute
	apnsTokenMinLife = 20 * time.Minute
)

// APNs sends through Apple's HTTP/2 provider API with token (JWT ES256)
// authentication.
type APNs struct {
	// Static after construction.
	cfg    APNsConfig
	key    *ecdsa.PrivateKey
	client *http.Client
	now    func() time.Time

	mu     sync.Mutex // guards token and madeAt
	token  string
	madeAt time.Time
}

// NewAPNs reads the signing key and returns the provider. client must
// speak HTTP/2 (Go's default transport does over TLS).
func NewAPNs(cfg APNsConfig, client *http.Client) (*APNs, error) {
	pem, err := os.ReadFile(cfg.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("apns_key_file: %w", err)
	}
	key, err := jwt.ParseECPrivateKeyFromPEM(pem)
	if err != nil {
		return nil, fmt.Errorf("apns_key_file: %w", err)
	}
	if cfg.KeyID == "" || cfg.TeamID == "" || cfg.Topic == "" {
		return nil, fmt.Errorf("apns: apns_key_id, apns_team_id and apns_topic are required")
	}
	return &APNs{cfg: cfg, key: key, client: client, now: time.Now}, nil
}

// Name implements Provider.
func (a *APNs) Name() string { return "apns" }

// providerToken returns the current provider token, making a new one when
// it is older than apnsTokenLife or is stale (Apple said it expired). A
// stale token younger than apnsTokenMinLife is not remade (Apple would
// refuse the change): wait is then how long until it may be.
func (a *APNs) providerToken(stale string) (tok string, wait time.Duration, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	age := now.Sub(a.madeAt)
	if a.token != "" && age < apnsTokenLife && (a.token != stale || age < apnsTokenMinLife) {
		if a.token == stale {
			return "", apnsTokenMinLife - age, nil
		}
		return a.token, 0, nil
	}
	t := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": a.cfg.TeamID, "iat": now.Unix()})
	t.Header["kid"] = a.cfg.KeyID
	s, err := t.SignedString(a.key)
	if err != nil {
		return "", 0, err
	}
	a.token, a.madeAt = s, now
	return s, 0, nil
}

// apnsID is a UUID made from the idempotency key, so every attempt at one
// notification carries the same apns-id.
func apnsID(key string) string {
	h := sha256.Sum256([]byte(key))
	h[6] = h[6]&0x0f | 0x50
	h[8] = h[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// apnsPayload is the JSON body and the push of n: aps for the system
// (apnsPushOf), parley for the app. The title, then the preview, are cut
// (on a character boundary, ending with "…") until the body fits Apple's
// 4096 bytes.
func apnsPayload(n *Notification) ([]byte, apnsPush, error) {
	m := *n
	build := func(title, preview string) ([]byte, apnsPush) {
		m.Title, m.Preview = title, preview
		p := apnsPushOf(&m)
		return marshal(map[string]any{"aps": p.aps, "parley": m.Data()}), p
	}
	title, preview, ok := fitText(n.Title, n.Preview, func(title, preview string) int {
		b, _ := build(title, preview)
		return len(b) - apnsPayloadMax
	})
	if !ok {
		return nil, apnsPush{}, fmt.Errorf("the payload exceeds %d bytes without title and preview", apnsPayloadMax)
	}
	b, p := build(title, preview)
	return b, p, nil
}

// apnsConfigReasons are Apple's refusals of the server's own
// configuration (key, team, topic) rather than of the device: the
// registration stays (a wrong apns_topic must not delete every APNs
// registration).
var apnsConfigReasons = map[string]bool{
	"DeviceTokenNotForTopic": true, "BadTopic": true, "TopicDisallowed": true, "MissingTopic": true,
	"InvalidProviderToken": true, "MissingProviderToken": true, "BadCertificate": true,
	"BadCertificateEnvironment": true, "Forbidden": true,
}

// Send implements Provider.
func (a *APNs) Send(ctx context.Context, n *Notification) error {
	body, push, err := apnsPayload(n)
	if err != nil {
		return &SendError{Reason: ReasonRejected, Detail: err.Error()}
	}
	endpoint := a.cfg.Endpoint
	if n.Sandbox {
		endpoint = a.cfg.SandboxEndpoint
	}
	stale := ""
	for attempt := 0; ; attempt++ {
		tok, wait, err := a.providerToken(stale)
		if err != nil {
			return &SendError{Reason: ReasonConfig, Detail: "signing the provider token: " + err.Error()}
		}
		if tok == "" {
			return &SendError{Reason: ReasonUnavailable, Status: http.StatusForbidden, RetryAfter: wait,
				Detail: "ExpiredProviderToken for a token younger than 20 minutes (is the clock right?)"}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+"/3/device/"+url.PathEscape(n.Token), bytes.NewReader(body))
		if err != nil {
			return &SendError{Reason: ReasonBadToken, Detail: err.Error()}
		}
		now := a.now()
		req.Header.Set("authorization", "bearer "+tok)
		req.Header.Set("apns-topic", a.cfg.Topic)
		req.Header.Set("apns-push-type", push.pushType)
		req.Header.Set("apns-id", apnsID(n.Key))
		req.Header.Set("apns-priority", push.priority)
		if push.collapseID != "" {
			req.Header.Set("apns-collapse-id", push.collapseID)
		}
		if a.cfg.TTL > 0 {
			req.Header.Set("apns-expiration", apnsExpiration(expiry(n, a.cfg.TTL, now), now))
		}
		req.Header.Set("content-type", "application/json")
		resp, err := a.client.Do(req)
		if err != nil {
			return fmt.Errorf("notify: apns: %w", err)
		}
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		var reply struct {
			Reason    string `json:"reason"`
			Timestamp int64  `json:"timestamp"` // 410: since when the token is invalid (Unix ms)
		}
		_ = json.Unmarshal(raw, &reply)
		switch {
		case resp.StatusCode == http.StatusGone && reply.Timestamp > 0 && n.RegisteredAt > reply.Timestamp:
			// The app registered the token again after Apple found it
			// invalid: it is valid again, only this push is lost.
			return &SendError{Reason: ReasonRejected, Status: resp.StatusCode,
				Detail: fmt.Sprintf("%s since %d, but registered again at %d: kept", reply.Reason, reply.Timestamp, n.RegisteredAt)}
		case resp.StatusCode == http.StatusGone,
			resp.StatusCode == http.StatusBadRequest && (reply.Reason == "BadDeviceToken" || reply.Reason == "Unregistered"):
			return &SendError{Reason: ReasonBadToken, Status: resp.StatusCode, Detail: reply.Reason}
		case resp.StatusCode == http.StatusForbidden && reply.Reason == "ExpiredProviderToken" && attempt == 0:
			stale = tok // make a new one (if Apple allows) and try once more
			continue
		case apnsConfigReasons[reply.Reason]:
			return &SendError{Reason: ReasonConfig, Status: resp.StatusCode, Detail: reply.Reason}
		}
		return statusError(resp, reply.Reason)
	}
}
