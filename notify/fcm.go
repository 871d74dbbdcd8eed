package notify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
	"golang.org/x/oauth2/jwt"
)

// FCMConfig is what the FCM provider needs (docs/notifications.md, "FCM").
type FCMConfig struct {
	Endpoint        string // e.g. https://fcm.googleapis.com
	CredentialsFile string // a service account's JSON key
	TTL             time.Duration
}

const fcmScope = "https://www.googleapis.com/auth/firebase.messaging"

// FCM sends through Firebase Cloud Messaging's HTTP v1 API, authorised
// with OAuth2 access tokens of a service account (fetched from the
// account's token_uri and refreshed before they expire by
// golang.org/x/oauth2; fetched anew when FCM says a token is not
// valid).
type FCM struct {
	// Static after construction.
	cfg     FCMConfig
	project string
	jwt     *jwt.Config
	ctx     context.Context // carries the HTTP client for the token endpoint
	client  *http.Client
	now     func() time.Time

	mu     sync.Mutex // guards tokens
	tokens oauth2.TokenSource
}

// NewFCM reads the service account file and returns the provider; client
// is used for both the token endpoint and FCM.
func NewFCM(cfg FCMConfig, client *http.Client) (*FCM, error) {
	data, err := os.ReadFile(cfg.CredentialsFile)
	if err != nil {
		return nil, fmt.Errorf("fcm_credentials_file: %w", err)
	}
	conf, err := google.JWTConfigFromJSON(data, fcmScope)
	if err != nil {
		return nil, fmt.Errorf("fcm_credentials_file: %w", err)
	}
	var account struct {
		ProjectID string `json:"project_id"`
	}
	if err := json.Unmarshal(data, &account); err != nil || account.ProjectID == "" {
		return nil, fmt.Errorf("fcm_credentials_file: no project_id")
	}
	ctx := context.WithValue(context.Background(), oauth2.HTTPClient, client)
	return &FCM{cfg: cfg, project: account.ProjectID, jwt: conf, ctx: ctx, client: client, now: time.Now,
		tokens: conf.TokenSource(ctx)}, nil
}

// Name implements Provider.
func (f *FCM) Name() string { return "fcm" }

// accessToken returns the current access token; when it is stale (FCM
// said it is not valid) a new one is fetched.
func (f *FCM) accessToken(stale string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	tok, err := f.tokens.Token()
	if err == nil && tok.AccessToken == stale {
		f.tokens = f.jwt.TokenSource(f.ctx) // an empty cache
		tok, err = f.tokens.Token()
	}
	if err != nil {
		return "", err
	}
	return tok.AccessToken, nil
}

// fcmDataSize is what FCM counts of a message's data: the bytes of its
// keys and values.
func fcmDataSize(d map[string]string) int {
	size := 0
	for k, v := range d {
		size += len(k) + len(strings.ToValidUTF8(v, "\uFFFD"))
	}
	return size
}

// message is the v1 messages:send body of n (docs/notifications.md,
// "FCM"): the data for every platform; android with its priority, ttl
// and, for badge notifications only, a collapse key; apns with the
// headers and aps dictionary an Apple device needs (apnsPushOf), which
// Android devices ignore. The title, then the preview, are cut to fit
// FCM's 4096 bytes of data and, on Apple devices, APNs's payload limit.
func (f *FCM) message(n *Notification, now time.Time) ([]byte, error) {
	m := *n
	var msg map[string]any
	build := func(title, preview string) int {
		m.Title, m.Preview = title, preview
		data := m.Data()
		push := apnsPushOf(&m)
		// What an Apple device gets: aps, and FCM puts the data keys
		// beside it.
		ios := map[string]any{"aps": push.aps}
		for k, v := range data {
			ios[k] = v
		}
		android := map[string]any{"priority": "high"}
		headers := map[string]string{"apns-push-type": push.pushType, "apns-priority": push.priority}
		if f.cfg.TTL > 0 {
			exp := expiry(n, f.cfg.TTL, now)
			ttl := min(max(exp.Sub(now), 0), fcmTTLMax)
			android["ttl"] = strconv.FormatInt(int64(ttl/time.Second), 10) + "s"
			headers["apns-expiration"] = apnsExpiration(exp, now)
		}
		switch n.Kind {
		case KindBadge:
			// Only the newest badge matters: one collapse key of the
			// four FCM keeps per device.
			android["priority"], android["collapse_key"] = "normal", "badge"
		case KindRecall:
			android["priority"] = "normal"
		}
		if push.collapseID != "" {
			headers["apns-collapse-id"] = push.collapseID
		}
		msg = map[string]any{"token": n.Token, "data": data, "android": android,
			"apns": map[string]any{"headers": headers, "payload": map[string]any{"aps": push.aps}}}
		return max(fcmDataSize(data)-fcmDataMax, len(marshal(ios))-(apnsPayloadMax-fcmAPNsReserve))
	}
	title, preview, ok := fitText(n.Title, n.Preview, build)
	if !ok {
		return nil, fmt.Errorf("the message exceeds FCM's limits without title and preview")
	}
	build(title, preview)
	return marshal(map[string]any{"message": msg}), nil
}

// fcmInvalidToken is the message of FCM's documented answer to a
// registration token that is not one (400 INVALID_ARGUMENT).
const fcmInvalidToken = "The registration token is not a valid FCM registration token"

// fcmError is the google.rpc.Status of an FCM error answer.
type fcmError struct {
	Error struct {
		Status  string `json:"status"`
		Message string `json:"message"`
		Details []struct {
			Type            string `json:"@type"`
			ErrorCode       string `json:"errorCode"`
			FieldViolations []struct {
				Field string `json:"field"`
			} `json:"fieldViolations"`
		} `json:"details"`
	} `json:"error"`
}

// classify turns an FCM error answer into a SendError: only the token's
// own errors (UNREGISTERED; INVALID_ARGUMENT on message.token or with the
// documented invalid-token message) remove the registration; errors of
// the server's credentials or project (401, 403, THIRD_PARTY_AUTH_ERROR,
// SENDER_ID_MISMATCH) are configuration errors; 429 and 5xx are retried.
func (e *fcmError) classify(resp *http.Response) *SendError {
	code := e.Error.Status
	tokenField := false
	for _, d := range e.Error.Details {
		if d.ErrorCode != "" {
			code = d.ErrorCode
		}
		for _, v := range d.FieldViolations {
			if v.Field == "message.token" {
				tokenField = true
			}
		}
	}
	detail := code + ": " + e.Error.Message
	switch {
	case code == "UNREGISTERED",
		resp.StatusCode == http.StatusBadRequest && (tokenField || e.Error.Message == fcmInvalidToken):
		return &SendError{Reason: ReasonBadToken, Status: resp.StatusCode, Detail: detail}
	case code == "SENDER_ID_MISMATCH", code == "THIRD_PARTY_AUTH_ERROR",
		resp.StatusCode == http.StatusUnauthorized, resp.StatusCode == http.StatusForbidden:
		return &SendError{Reason: ReasonConfig, Status: resp.StatusCode, Detail: detail}
	}
	return statusError(resp, detail)
}

// Send implements Provider.
func (f *FCM) Send(ctx context.Context, n *Notification) error {
	body, err := f.message(n, f.now())
	if err != nil {
		return &SendError{Reason: ReasonRejected, Detail: err.Error()}
	}
	stale := ""
	for attempt := 0; ; attempt++ {
		tok, err := f.accessToken(stale)
		if err != nil {
			var re *oauth2.RetrieveError
			if errors.As(err, &re) && re.Response != nil && re.Response.StatusCode/100 == 4 {
				// The token endpoint refused the service account.
				return &SendError{Reason: ReasonConfig, Status: re.Response.StatusCode, Detail: "access token: " + err.Error()}
			}
			return fmt.Errorf("notify: fcm: access token: %w", err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost,
			f.cfg.Endpoint+"/v1/projects/"+f.project+"/messages:send", bytes.NewReader(body))
		if err != nil {
			return &SendError{Reason: ReasonRejected, Detail: err.Error()}
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := f.client.Do(req)
		if err != nil {
			return fmt.Errorf("notify: fcm: %w", err)
		}
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 8192))
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		var reply fcmError
		_ = json.Unmarshal(raw, &reply)
		if resp.StatusCode == http.StatusUnauthorized && reply.Error.Status == "UNAUTHENTICATED" && attempt == 0 {
			stale = tok // revoked or expired early: fetch a new one and try once more
			continue
		}
		return reply.classify(resp)
	}
}
