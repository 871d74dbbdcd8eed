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
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/golang-jwt/jwt/v5"
)

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
		Badge: 5, Title: "Team", Ts: time.Now().UnixMilli(), Key: "d1:g1:7", Target: 3}
}

// newAPNsPair is the APNs provider as parleyd builds it (its HTTP
// client trusting the fake's certificate) and a fake APNs sharing its
// clock.
func newAPNsPair(t *testing.T) (*APNs, *fakeAPNs, *testClock) {
	p8, key := writeP8(t)
	clock := newTestClock()
	fake := newFakeAPNs(t, &key.PublicKey, clock)
	a, err := NewAPNs(APNsConfig{Endpoint: fake.srv.URL, SandboxEndpoint: fake.srv.URL, KeyFile: p8, KeyID: "KEY123",
		TeamID: "TEAM42", Topic: "im.parley.app", TTL: time.Hour}, prodClient(fake.srv))
	if err != nil {
		t.Fatal(err)
	}
	a.now = clock.now
	return a, fake, clock
}

// TestAPNs: alert and background pushes over HTTP/2 with a valid ES256
// provider token and Apple's headers; token errors, 429 with Retry-After
// and 5xx are classified; the provider token is reused, refreshed before
// it expires, and remade when Apple says it expired.
func TestAPNs(t *testing.T) {
	a, fake, clock := newAPNsPair(t)
	good := fake.device("good", "im.parley.app")
	ctx := context.Background()
	if err := a.Send(ctx, testNotification(good, KindMsg)); err != nil {
		t.Fatal(err)
	}
	p := fake.last()
	h := p.header
	if h.Get("apns-topic") != "im.parley.app" || h.Get("apns-push-type") != "alert" || h.Get("apns-collapse-id") != "g1" ||
		h.Get("apns-priority") != "10" || h.Get("apns-expiration") == "" {
		t.Fatalf("alert headers %v", h)
	}
	aps := p.body["aps"].(map[string]any)
	data := p.body["parley"].(map[string]any)
	if aps["badge"].(float64) != 5 || data["conv"] != "g1" || data["seq"] != "7" || data["count"] != "2" || data["kind"] != "msg" || data["sender"] != "ana" {
		t.Fatalf("alert body %v", p.body)
	}
	if err := a.Send(ctx, testNotification(good, KindRecall)); err != nil {
		t.Fatal(err)
	}
	p = fake.last()
	h = p.header
	aps = p.body["aps"].(map[string]any)
	if h.Get("apns-push-type") != "background" || h.Get("apns-priority") != "5" || aps["content-available"].(float64) != 1 ||
		p.body["parley"].(map[string]any)["target"] != "3" {
		t.Fatalf("recall: headers %v body %v", h, p.body)
	}
	if fake.taken()[0].header.Get("apns-id") != apnsID("d1:g1:7") {
		t.Fatal("apns-id is not derived from the idempotency key")
	}
	gone, busy, boom := fake.device("gone", "im.parley.app"), fake.device("busy", "im.parley.app"), fake.device("boom", "im.parley.app")
	fake.setDevice(gone, func(d *apnsDevice) { d.goneAt = 1700000000000 })
	fake.setDevice(busy, func(d *apnsDevice) { d.status = http.StatusTooManyRequests })
	fake.setDevice(boom, func(d *apnsDevice) { d.status = http.StatusInternalServerError })
	bad := strings.Repeat("0f", 32) // a token Apple never issued
	for token, want := range map[string]string{bad: ReasonBadToken, gone: ReasonBadToken, busy: ReasonThrottled, boom: ReasonUnavailable} {
		reason, after := reasonOf(a.Send(ctx, testNotification(token, KindMsg)))
		if reason != want {
			t.Errorf("token %s: reason %s, want %s", token, reason, want)
		}
		if token == busy && after != 7*time.Second {
			t.Errorf("Retry-After: %v, want 7s", after)
		}
	}
	if len(fake.tokens) != 1 {
		t.Fatalf("%d provider tokens for requests within minutes, want 1", len(fake.tokens))
	}
	// 51 minutes later a new token is made (Apple refuses one older than an hour).
	clock.advance(51 * time.Minute)
	if err := a.Send(ctx, testNotification(good, KindMsg)); err != nil {
		t.Fatal(err)
	}
	if len(fake.tokens) != 2 {
		t.Fatalf("provider token not refreshed: %d tokens", len(fake.tokens))
	}
	// ExpiredProviderToken for a token 21 minutes old: remade and the
	// request sent once more.
	clock.advance(21 * time.Minute)
	fake.mu.Lock()
	fake.expireIt = true
	fake.mu.Unlock()
	if err := a.Send(ctx, testNotification(good, KindMsg)); err != nil {
		t.Fatalf("after ExpiredProviderToken: %v", err)
	}
	if len(fake.tokens) != 3 {
		t.Fatalf("provider token not remade after ExpiredProviderToken: %d tokens", len(fake.tokens))
	}
}

// TestAPNsProviderTokenRefreshRate: Apple refuses a connection whose
// provider token changes more than once in 20 minutes
// (TooManyProviderTokenUpdates); an ExpiredProviderToken for a token
// younger than that (a skewed clock) is retried later with the same
// token instead of provoking that refusal.
func TestAPNsProviderTokenRefreshRate(t *testing.T) {
	a, fake, clock := newAPNsPair(t)
	good := fake.device("good", "im.parley.app")
	ctx := context.Background()
	if err := a.Send(ctx, testNotification(good, KindMsg)); err != nil {
		t.Fatal(err)
	}
	clock.advance(5 * time.Minute)
	fake.mu.Lock()
	fake.expireIt = true
	fake.mu.Unlock()
	reason, after := reasonOf(a.Send(ctx, testNotification(good, KindMsg)))
	if n := fake.refusals("TooManyProviderTokenUpdates"); n != 0 {
		t.Fatalf("the token was remade 5 minutes after the last: Apple refused it %d times", n)
	}
	if reason != ReasonUnavailable || after != 15*time.Minute {
		t.Fatalf("ExpiredProviderToken for a 5-minute-old token: %s after %v, want unavailable after 15m", reason, after)
	}
	if len(fake.tokens) != 1 {
		t.Fatalf("%d provider tokens, want 1", len(fake.tokens))
	}
	// An hour and more without a request: the token is remade, never
	// sent stale.
	clock.advance(70 * time.Minute)
	if err := a.Send(ctx, testNotification(good, KindMsg)); err != nil {
		t.Fatal(err)
	}
	if fake.refusals("ExpiredProviderToken") != 1 { // the one forced above
		t.Fatalf("refusals %v", fake.refused)
	}
}

// TestAPNsCollapseID: a conversation id longer than Apple's 64 bytes (or
// not printable ASCII) becomes a stable 45-byte hash; a short one is the
// id itself.
func TestAPNsCollapseID(t *testing.T) {
	a, fake, _ := newAPNsPair(t)
	good := fake.device("good", "im.parley.app")
	ctx := context.Background()
	long := "g." + strings.Repeat("x", 126) // 128 bytes, the longest group id
	for _, conv := range []string{long, long, strings.Repeat("y", 64), "grüppe"} {
		n := testNotification(good, KindMsg)
		n.Conv = conv
		if err := a.Send(ctx, n); err != nil {
			t.Fatalf("conversation %q: %v", conv, err)
		}
	}
	p := fake.taken()
	if got := p[0].header.Get("apns-collapse-id"); len(got) > 64 || got != p[1].header.Get("apns-collapse-id") || got != apnsCollapseID(long) {
		t.Fatalf("collapse id of a 128-byte conversation: %q then %q", got, p[1].header.Get("apns-collapse-id"))
	}
	if got := p[2].header.Get("apns-collapse-id"); got != strings.Repeat("y", 64) {
		t.Fatalf("collapse id of a 64-byte conversation: %q", got)
	}
	if got := p[3].header.Get("apns-collapse-id"); got == "grüppe" || len(got) != 45 || got[0] != '{' {
		t.Fatalf("collapse id of a non-ASCII conversation: %q", got)
	}
	if p[0].body["aps"].(map[string]any)["thread-id"] != long {
		t.Fatalf("thread-id %v", p[0].body["aps"])
	}
}

// TestAPNsPayloadLimit: a title and a preview too long for Apple's 4096
// bytes are cut on a character boundary, ending with "…", and the push
// is delivered.
func TestAPNsPayloadLimit(t *testing.T) {
	a, fake, _ := newAPNsPair(t)
	good := fake.device("good", "im.parley.app")
	n := testNotification(good, KindMsg)
	n.Title = strings.Repeat("é", 3000) // 6000 bytes
	n.Preview = strings.Repeat("ü", 100)
	if err := a.Send(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	p := fake.last()
	alert := p.body["aps"].(map[string]any)["alert"].(map[string]any)
	data := p.body["parley"].(map[string]any)
	title := alert["title"].(string)
	if p.size > 4096 || !utf8.ValidString(title) || !strings.HasSuffix(title, "…") ||
		!strings.HasPrefix(n.Title, strings.TrimSuffix(title, "…")) || data["title"] != title {
		t.Fatalf("payload of %d bytes, title %q (%d bytes)", p.size, title, len(title))
	}
	if alert["body"] != n.Preview || data["preview"] != n.Preview {
		t.Fatalf("the preview was cut though the title made room: %q", alert["body"])
	}
	// A short title is not touched.
	n = testNotification(good, KindMsg)
	if err := a.Send(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	if got := fake.last().body["aps"].(map[string]any)["alert"].(map[string]any)["title"]; got != "Team" {
		t.Fatalf("title %q", got)
	}
}

// TestAPNsKinds: each kind is the push Apple documents for it: a message
// an alert (priority 10) with alert, badge and sound; a badge update an
// alert push with only aps.badge (priority 5); a recall a background
// push with only content-available (priority 5). Apple delivers each.
func TestAPNsKinds(t *testing.T) {
	a, fake, _ := newAPNsPair(t)
	good := fake.device("good", "im.parley.app")
	want := map[string]struct {
		pushType, priority string
		aps                map[string]any
	}{
		KindMsg: {"alert", "10", map[string]any{"alert": map[string]any{"title": "Team", "body": "2 new messages"},
			"badge": 5.0, "sound": "default", "thread-id": "g1"}},
		KindBadge:  {"alert", "5", map[string]any{"badge": 5.0}},
		KindRecall: {"background", "5", map[string]any{"content-available": 1.0}},
	}
	for _, kind := range []string{KindMsg, KindBadge, KindRecall} {
		if err := a.Send(context.Background(), testNotification(good, kind)); err != nil {
			t.Fatal(err)
		}
		p, w := fake.last(), want[kind]
		if p.header.Get("apns-push-type") != w.pushType || p.header.Get("apns-priority") != w.priority ||
			!reflect.DeepEqual(p.body["aps"], w.aps) || p.dropped != "" {
			t.Errorf("%s: %s priority %s aps %v (dropped: %q); want %s priority %s aps %v", kind, p.header.Get("apns-push-type"),
				p.header.Get("apns-priority"), p.body["aps"], p.dropped, w.pushType, w.priority, w.aps)
		}
		if kind != KindMsg && p.header.Get("apns-collapse-id") != "" {
			t.Errorf("%s: apns-collapse-id %q", kind, p.header.Get("apns-collapse-id"))
		}
	}
}

// TestAPNsExpiration: apns-expiration is notify_ttl after the commit,
// whichever attempt sends it; past it, 0 (now or never).
func TestAPNsExpiration(t *testing.T) {
	a, fake, clock := newAPNsPair(t)
	good := fake.device("good", "im.parley.app")
	n := testNotification(good, KindMsg)
	n.Ts = clock.now().Add(-30 * time.Minute).UnixMilli() // a retry half an hour after the commit
	if err := a.Send(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	if got, want := fake.last().header.Get("apns-expiration"), strconv.FormatInt(time.UnixMilli(n.Ts).Add(time.Hour).Unix(), 10); got != want {
		t.Fatalf("apns-expiration %s, want %s (commit + notify_ttl)", got, want)
	}
	n.Ts = clock.now().Add(-2 * time.Hour).UnixMilli()
	if err := a.Send(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	if got := fake.last().header.Get("apns-expiration"); got != "0" {
		t.Fatalf("apns-expiration %s past notify_ttl, want 0", got)
	}
}

// TestAPNsGoneTimestamp: Apple's 410 says since when the token is
// invalid; a token the app registered again after that is not a bad
// token.
func TestAPNsGoneTimestamp(t *testing.T) {
	a, fake, _ := newAPNsPair(t)
	gone := fake.device("gone", "im.parley.app")
	const since = 1700000000000
	fake.setDevice(gone, func(d *apnsDevice) { d.goneAt = since })
	n := testNotification(gone, KindMsg)
	n.RegisteredAt = since + 1000
	if reason, _ := reasonOf(a.Send(context.Background(), n)); reason != ReasonRejected {
		t.Fatalf("410 for a token registered after Apple's timestamp: %s, want rejected (kept)", reason)
	}
	n.RegisteredAt = since - 1000
	if reason, _ := reasonOf(a.Send(context.Background(), n)); reason != ReasonBadToken {
		t.Fatalf("410 for a token registered before Apple's timestamp: %s, want bad_token", reason)
	}
}

// TestAPNsTopicMismatch: DeviceTokenNotForTopic (a wrong apns_topic) is
// the server's configuration error, not the device's.
func TestAPNsTopicMismatch(t *testing.T) {
	a, fake, _ := newAPNsPair(t)
	other := fake.device("other", "im.other.app")
	if reason, _ := reasonOf(a.Send(context.Background(), testNotification(other, KindMsg))); reason != ReasonConfig {
		t.Fatalf("DeviceTokenNotForTopic: %s, want config", reason)
	}
}

func rsaKey(t *testing.T) *rsa.PrivateKey {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func writeServiceAccount(t *testing.T, tokenURI string) (string, *rsa.PrivateKey) {
	key := rsaKey(t)
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
