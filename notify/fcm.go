package notify

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
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
// golang.org/x/oauth2).
type FCM struct {
	// Static after construction.
	cfg     FCMConfig
	project string
	tokens  oauth2.TokenSource
	client  *http.Client
}

// NewFCM reads the service account file and returns the provider; client
// is used for both the token endpoint and FCM.
func NewFCM(cfg FCMConfig, client *http.Client) (*FCM, error) {
	data, err := os.ReadFile(cfg.CredentialsFile)
	if err != nil {
		return nil, fmt.Errorf("fcm_credentials_file: %w", err)
	}
	ctx := context.WithValue(context.Background(), oauth2.HTTPClient, client)
	creds, err := google.CredentialsFromJSONWithType(ctx, data, google.ServiceAccount, fcmScope)
	if err != nil {
		return nil, fmt.Errorf("fcm_credentials_file: %w", err)
	}
	if creds.ProjectID == "" {
		return nil, fmt.Errorf("fcm_credentials_file: no project_id")
	}
	return &FCM{cfg: cfg, project: creds.ProjectID, tokens: oauth2.ReuseTokenSource(nil, creds.TokenSource), client: client}, nil
}

// Name implements Provider.
func (f *FCM) Name() string { return "fcm" }

// fcmMessage is the v1 messages:send body.
func (f *FCM) message(n *Notification) ([]byte, error) {
	android := map[string]any{"collapse_key": n.Conv, "priority": "high"}
	if f.cfg.TTL > 0 {
		android["ttl"] = strconv.FormatInt(int64(f.cfg.TTL/time.Second), 10) + "s"
	}
	msg := map[string]any{"token": n.Token, "data": n.Data(), "android": android}
	if n.Kind != KindMsg {
		android["priority"] = "normal"
		delete(android, "collapse_key")
	}
	return json.Marshal(map[string]any{"message": msg})
}

// Send implements Provider.
func (f *FCM) Send(ctx context.Context, n *Notification) error {
	body, err := f.message(n)
	if err != nil {
		return &SendError{Reason: ReasonRejected, Detail: err.Error()}
	}
	tok, err := f.tokens.Token()
	if err != nil {
		return fmt.Errorf("notify: fcm: access token: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		f.cfg.Endpoint+"/v1/projects/"+f.project+"/messages:send", bytes.NewReader(body))
	if err != nil {
		return &SendError{Reason: ReasonRejected, Detail: err.Error()}
	}
	req.Header.Set("Authorization", "Bearer "+tok.AccessToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		return fmt.Errorf("notify: fcm: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 8192))
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	var reply struct {
		Error struct {
			Status  string `json:"status"`
			Message string `json:"message"`
			Details []struct {
				ErrorCode       string `json:"errorCode"`
				FieldViolations []struct {
					Field string `json:"field"`
				} `json:"fieldViolations"`
			} `json:"details"`
		} `json:"error"`
	}
	_ = json.Unmarshal(raw, &reply)
	code := reply.Error.Status
	tokenField := strings.Contains(strings.ToLower(reply.Error.Message), "token")
	for _, d := range reply.Error.Details {
		if d.ErrorCode != "" {
			code = d.ErrorCode
		}
		for _, v := range d.FieldViolations {
			if v.Field == "message.token" {
				tokenField = true
			}
		}
	}
	switch {
	case resp.StatusCode == http.StatusNotFound && code == "UNREGISTERED",
		resp.StatusCode == http.StatusBadRequest && code == "INVALID_ARGUMENT" && tokenField:
		return &SendError{Reason: ReasonBadToken, Status: resp.StatusCode, Detail: code}
	}
	return statusError(resp, code+": "+reply.Error.Message)
}
