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
	"os"
	"strconv"
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

// apnsTokenLife is how long a provider token is used: Apple accepts one
// for an hour and refuses refreshing it more than once in 20 minutes.
const apnsTokenLife = 50 * time.Minute

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
// it is older than apnsTokenLife or stale (Apple said it expired).
func (a *APNs) providerToken(stale string) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if a.token != "" && a.token != stale && now.Sub(a.madeAt) < apnsTokenLife {
		return a.token, nil
	}
	t := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": a.cfg.TeamID, "iat": now.Unix()})
	t.Header["kid"] = a.cfg.KeyID
	s, err := t.SignedString(a.key)
	if err != nil {
		return "", err
	}
	a.token, a.madeAt = s, now
	return s, nil
}

// apnsID is a UUID made from the idempotency key, so every attempt at one
// notification carries the same apns-id.
func apnsID(key string) string {
	h := sha256.Sum256([]byte(key))
	h[6] = h[6]&0x0f | 0x50
	h[8] = h[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// apnsPayload is the JSON body: aps for the system, parley for the app.
func apnsPayload(n *Notification) ([]byte, string) {
	aps := map[string]any{"badge": n.Badge}
	pushType := "background"
	if n.Kind == KindMsg {
		pushType = "alert"
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
		aps["alert"] = map[string]string{"title": title, "body": body}
		aps["sound"] = "default"
		aps["thread-id"] = n.Conv
	} else {
		aps["content-available"] = 1
	}
	b, _ := json.Marshal(map[string]any{"aps": aps, "parley": n.Data()})
	return b, pushType
}

// Send implements Provider.
func (a *APNs) Send(ctx context.Context, n *Notification) error {
	body, pushType := apnsPayload(n)
	endpoint := a.cfg.Endpoint
	if n.Sandbox {
		endpoint = a.cfg.SandboxEndpoint
	}
	stale := ""
	for attempt := 0; ; attempt++ {
		tok, err := a.providerToken(stale)
		if err != nil {
			return &SendError{Reason: ReasonRejected, Detail: "signing the provider token: " + err.Error()}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+"/3/device/"+n.Token, bytes.NewReader(body))
		if err != nil {
			return &SendError{Reason: ReasonBadToken, Detail: err.Error()}
		}
		req.Header.Set("authorization", "bearer "+tok)
		req.Header.Set("apns-topic", a.cfg.Topic)
		req.Header.Set("apns-push-type", pushType)
		req.Header.Set("apns-id", apnsID(n.Key))
		if pushType == "alert" {
			req.Header.Set("apns-priority", "10")
			req.Header.Set("apns-collapse-id", n.Conv)
		} else {
			req.Header.Set("apns-priority", "5")
		}
		if a.cfg.TTL > 0 {
			req.Header.Set("apns-expiration", strconv.FormatInt(a.now().Add(a.cfg.TTL).Unix(), 10))
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
			Reason string `json:"reason"`
		}
		_ = json.Unmarshal(raw, &reply)
		switch {
		case resp.StatusCode == http.StatusGone,
			resp.StatusCode == http.StatusBadRequest && (reply.Reason == "BadDeviceToken" || reply.Reason == "Unregistered" || reply.Reason == "DeviceTokenNotForTopic"):
			return &SendError{Reason: ReasonBadToken, Status: resp.StatusCode, Detail: reply.Reason}
		case resp.StatusCode == http.StatusForbidden && reply.Reason == "ExpiredProviderToken" && attempt == 0:
			stale = tok // make a new one and try once more
			continue
		}
		return statusError(resp, reply.Reason)
	}
}
