package notify

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// fakeAPNs speaks Apple's provider API over HTTP/2 with TLS: it checks the
// provider token (ES256, kid, iss, iat) and the headers, and answers by
// device token: "good" 200, "bad" 400 BadDeviceToken, "gone" 410
// Unregistered, "busy" 429 with Retry-After.
type fakeAPNs struct {
	t   *testing.T
	srv *httptest.Server
	pub *ecdsa.PublicKey

	mu       sync.Mutex
	tokens   map[string]int // provider tokens seen
	bodies   []map[string]any
	headers  []http.Header
	expireIt bool // answer the next request 403 ExpiredProviderToken
}

func newFakeAPNs(t *testing.T, pub *ecdsa.PublicKey) *fakeAPNs {
	f := &fakeAPNs{t: t, pub: pub, tokens: map[string]int{}}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.srv.EnableHTTP2 = true
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPNs) serve(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 2 {
		f.t.Errorf("APNs request over %s, want HTTP/2", r.Proto)
	}
	auth := strings.TrimPrefix(r.Header.Get("authorization"), "bearer ")
	tok, err := jwt.Parse(auth, func(tk *jwt.Token) (any, error) {
		if tk.Header["kid"] != "KEY123" {
			return nil, errors.New("wrong kid")
		}
		return f.pub, nil
	}, jwt.WithValidMethods([]string{"ES256"}), jwt.WithIssuer("TEAM42"), jwt.WithIssuedAt())
	if err != nil || !tok.Valid {
		f.t.Errorf("provider token %q: %v", auth, err)
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"reason":"InvalidProviderToken"}`))
		return
	}
	for _, h := range []string{"apns-topic", "apns-push-type", "apns-id"} {
		if r.Header.Get(h) == "" {
			f.t.Errorf("missing header %s", h)
		}
	}
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	f.mu.Lock()
	f.tokens[auth]++
	expire := f.expireIt
	f.expireIt = false
	f.bodies = append(f.bodies, body)
	f.headers = append(f.headers, r.Header.Clone())
	f.mu.Unlock()
	if expire {
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"reason":"ExpiredProviderToken"}`))
		return
	}
	switch strings.TrimPrefix(r.URL.Path, "/3/device/") {
	case "good":
		w.Header().Set("apns-id", r.Header.Get("apns-id"))
		w.WriteHeader(http.StatusOK)
	case "bad":
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"reason":"BadDeviceToken"}`))
	case "gone":
		w.WriteHeader(http.StatusGone)
		_, _ = w.Write([]byte(`{"reason":"Unregistered","timestamp":1700000000000}`))
	case "busy":
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"reason":"TooManyRequests"}`))
	default:
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"reason":"InternalServerError"}`))
	}
}

func writeP8(t *testing.T) (string, *ecdsa.PrivateKey) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "AuthKey_KEY123.p8")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, key
}

func testNotification(token, kind string) *Notification {
	return &Notification{Device: "d1", User: "u1", Token: token, Conv: "g1", Seq: 7, Kind: kind, Sender: "ana", Count: 2,
		Badge: 5, Title: "Team", Ts: 1700000000000, Key: "d1:g1:7", Target: 3}
}

// TestAPNs: alert and background pushes over HTTP/2 with a valid ES256
// provider token and Apple's headers; token errors, 429 with Retry-After
// and 5xx are classified; the provider token is reused, refreshed before
// it expires, and remade when Apple says it expired.
func TestAPNs(t *testing.T) {
	p8, key := writeP8(t)
	fake := newFakeAPNs(t, &key.PublicKey)
	a, err := NewAPNs(APNsConfig{Endpoint: fake.srv.URL, SandboxEndpoint: fake.srv.URL, KeyFile: p8, KeyID: "KEY123",
		TeamID: "TEAM42", Topic: "im.parley.app", TTL: time.Hour}, fake.srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := a.Send(ctx, testNotification("good", KindMsg)); err != nil {
		t.Fatal(err)
	}
	h := fake.headers[0]
	if h.Get("apns-topic") != "im.parley.app" || h.Get("apns-push-type") != "alert" || h.Get("apns-collapse-id") != "g1" ||
		h.Get("apns-priority") != "10" || h.Get("apns-expiration") == "" {
		t.Fatalf("alert headers %v", h)
	}
	aps := fake.bodies[0]["aps"].(map[string]any)
	data := fake.bodies[0]["parley"].(map[string]any)
	if aps["badge"].(float64) != 5 || data["conv"] != "g1" || data["seq"] != "7" || data["count"] != "2" || data["kind"] != "msg" || data["sender"] != "ana" {
		t.Fatalf("alert body %v", fake.bodies[0])
	}
	if err := a.Send(ctx, testNotification("good", KindRecall)); err != nil {
		t.Fatal(err)
	}
	h = fake.headers[1]
	aps = fake.bodies[1]["aps"].(map[string]any)
	if h.Get("apns-push-type") != "background" || h.Get("apns-priority") != "5" || aps["content-available"].(float64) != 1 ||
		fake.bodies[1]["parley"].(map[string]any)["target"] != "3" {
		t.Fatalf("recall: headers %v body %v", h, fake.bodies[1])
	}
	if fake.headers[0].Get("apns-id") != apnsID("d1:g1:7") {
		t.Fatal("apns-id is not derived from the idempotency key")
	}
	for token, want := range map[string]string{"bad": ReasonBadToken, "gone": ReasonBadToken, "busy": ReasonThrottled, "boom": ReasonUnavailable} {
		reason, after := reasonOf(a.Send(ctx, testNotification(token, KindMsg)))
		if reason != want {
			t.Errorf("token %s: reason %s, want %s", token, reason, want)
		}
		if token == "busy" && after != 7*time.Second {
			t.Errorf("Retry-After: %v, want 7s", after)
		}
	}
	if len(fake.tokens) != 1 {
		t.Fatalf("%d provider tokens for requests within minutes, want 1", len(fake.tokens))
	}
	// 50 minutes later a new token is made (Apple refuses one older than an hour).
	a.mu.Lock()
	a.madeAt = a.madeAt.Add(-51 * time.Minute)
	a.mu.Unlock()
	if err := a.Send(ctx, testNotification("good", KindMsg)); err != nil {
		t.Fatal(err)
	}
	if len(fake.tokens) != 2 {
		t.Fatalf("provider token not refreshed: %d tokens", len(fake.tokens))
	}
	// ExpiredProviderToken: remade and the request sent once more.
	fake.mu.Lock()
	fake.expireIt = true
	fake.mu.Unlock()
	if err := a.Send(ctx, testNotification("good", KindMsg)); err != nil {
		t.Fatalf("after ExpiredProviderToken: %v", err)
	}
	if len(fake.tokens) != 3 {
		t.Fatalf("provider token not remade after ExpiredProviderToken: %d tokens", len(fake.tokens))
	}
}

// fakeFCM is Google's OAuth2 token endpoint (it checks the service
// account's signed assertion) and the FCM HTTP v1 API (it checks the
// bearer token and the message), answering by registration token: "good"
// 200, "unreg" 404 UNREGISTERED, "invalid" 400 INVALID_ARGUMENT on
// message.token, "busy" 429 with Retry-After.
type fakeFCM struct {
	t   *testing.T
	srv *httptest.Server
	pub *rsa.PublicKey

	mu       sync.Mutex
	issued   int
	messages []map[string]any
}

func newFakeFCM(t *testing.T, pub *rsa.PublicKey) *fakeFCM {
	f := &fakeFCM{t: t, pub: pub}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /token", f.token)
	mux.HandleFunc("POST /v1/projects/parley-test/messages:send", f.send)
	f.srv = httptest.NewTLSServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeFCM) token(w http.ResponseWriter, r *http.Request) {
	if r.FormValue("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
		f.t.Errorf("grant_type %q", r.FormValue("grant_type"))
	}
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(r.FormValue("assertion"), claims, func(*jwt.Token) (any, error) { return f.pub, nil },
		jwt.WithValidMethods([]string{"RS256"}), jwt.WithAudience(f.srv.URL+"/token"), jwt.WithIssuer("notify@parley-test.iam.gserviceaccount.com"))
	if err != nil || claims["scope"] != fcmScope {
		f.t.Errorf("assertion: %v (claims %v)", err, claims)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.issued++
	n := f.issued
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "access-" + string(rune('0'+n)), "token_type": "Bearer", "expires_in": 3600})
}

func (f *fakeFCM) send(w http.ResponseWriter, r *http.Request) {
	if got := r.Header.Get("Authorization"); got != "Bearer access-1" {
		f.t.Errorf("Authorization %q", got)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var body struct {
		Message map[string]any `json:"message"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		f.t.Errorf("body: %v", err)
	}
	f.mu.Lock()
	f.messages = append(f.messages, body.Message)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch body.Message["token"] {
	case "good":
		_, _ = w.Write([]byte(`{"name":"projects/parley-test/messages/0:1"}`))
	case "unreg":
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":{"code":404,"message":"Requested entity was not found.","status":"NOT_FOUND","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"UNREGISTERED"}]}}`))
	case "invalid":
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":{"code":400,"message":"The registration token is not a valid FCM registration token","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"field":"message.token","description":"Invalid registration token"}]}]}}`))
	case "busy":
		w.Header().Set("Retry-After", "3")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"QUOTA_EXCEEDED"}]}}`))
	default:
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":{"code":503,"status":"UNAVAILABLE"}}`))
	}
}

func writeServiceAccount(t *testing.T, tokenURI string) (string, *rsa.PrivateKey) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	sa := map[string]string{"type": "service_account", "project_id": "parley-test", "private_key_id": "k1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": "notify@parley-test.iam.gserviceaccount.com", "client_id": "1", "token_uri": tokenURI}
	b, _ := json.Marshal(sa)
	path := filepath.Join(t.TempDir(), "service-account.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, key
}

// TestFCM: v1 messages with the service account's OAuth2 access token
// (fetched once from the token endpoint and reused), collapse_key = conv,
// string data; UNREGISTERED and an invalid token are token errors, 429
// honours Retry-After, 503 is retried.
func TestFCM(t *testing.T) {
	var fake *fakeFCM
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	fake = newFakeFCM(t, &key.PublicKey)
	path, k := writeServiceAccount(t, fake.srv.URL+"/token")
	fake.pub = &k.PublicKey
	f, err := NewFCM(FCMConfig{Endpoint: fake.srv.URL, CredentialsFile: path, TTL: time.Hour}, fake.srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := f.Send(ctx, testNotification("good", KindMsg)); err != nil {
		t.Fatal(err)
	}
	m := fake.messages[0]
	android := m["android"].(map[string]any)
	data := m["data"].(map[string]any)
	if m["token"] != "good" || android["collapse_key"] != "g1" || android["ttl"] != "3600s" || data["conv"] != "g1" ||
		data["seq"] != "7" || data["badge"] != "5" || data["count"] != "2" || data["kind"] != "msg" {
		t.Fatalf("message %v", m)
	}
	if err := f.Send(ctx, testNotification("good", KindBadge)); err != nil {
		t.Fatal(err)
	}
	if d := fake.messages[1]["data"].(map[string]any); d["kind"] != "badge" || d["conv"] != nil {
		t.Fatalf("badge message %v", fake.messages[1])
	}
	for token, want := range map[string]string{"unreg": ReasonBadToken, "invalid": ReasonBadToken, "busy": ReasonThrottled, "down": ReasonUnavailable} {
		reason, after := reasonOf(f.Send(ctx, testNotification(token, KindMsg)))
		if reason != want {
			t.Errorf("token %s: reason %s, want %s", token, reason, want)
		}
		if token == "busy" && after != 3*time.Second {
			t.Errorf("Retry-After %v, want 3s", after)
		}
	}
	if fake.issued != 1 {
		t.Fatalf("%d access tokens fetched, want 1 (reused until it expires)", fake.issued)
	}
}

// TestWebhookSignature: the signature is the documented HMAC, and a
// receiver's check (as docs/notifications.md shows it) accepts it.
func TestWebhookSignature(t *testing.T) {
	var got http.Header
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		body = make([]byte, r.ContentLength)
		_, _ = r.Body.Read(body)
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	wh := NewWebhook(srv.URL, "s3cret", srv.Client())
	if err := wh.Send(context.Background(), testNotification("tok", KindMsg)); err != nil {
		t.Fatal(err)
	}
	if got.Get(HeaderIdempotency) != "d1:g1:7" || got.Get(HeaderSignature) != Sign([]byte("s3cret"), got.Get(HeaderTimestamp), body) {
		t.Fatalf("headers %v", got)
	}
	if !strings.HasPrefix(got.Get(HeaderSignature), "sha256=") || len(got.Get(HeaderSignature)) != len("sha256=")+64 {
		t.Fatalf("signature %q", got.Get(HeaderSignature))
	}
}
