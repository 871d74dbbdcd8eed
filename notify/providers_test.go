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
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// newFCMPair is the FCM provider as parleyd builds it (its HTTP client
// trusting the fake's certificate) and a fake FCM; the provider's clock
// stands at now.
func newFCMPair(t *testing.T, now time.Time) (*FCM, *fakeFCM) {
	fake := newFakeFCM(t, nil)
	path, k := writeServiceAccount(t, fake.srv.URL+"/token")
	fake.setKey(&k.PublicKey)
	f, err := NewFCM(FCMConfig{Endpoint: fake.srv.URL, CredentialsFile: path, TTL: time.Hour}, prodClient(fake.srv))
	if err != nil {
		t.Fatal(err)
	}
	f.now = func() time.Time { return now }
	return f, fake
}

// TestFCM: v1 messages with the service account's OAuth2 access token
// (fetched once from the token endpoint and reused), string data, ttl
// notify_ttl; no per-conversation collapse key, badge notifications
// collapsed under "badge"; UNREGISTERED and an invalid token are token
// errors, 429 honours Retry-After, 503 is retried.
func TestFCM(t *testing.T) {
	t.Parallel()
	n := testNotification("", KindMsg)
	f, fake := newFCMPair(t, time.UnixMilli(n.Ts))
	good := fake.device("good", false)
	ctx := context.Background()
	n.Token = good
	if err := f.Send(ctx, n); err != nil {
		t.Fatal(err)
	}
	m := fake.messages[0]
	android := m["android"].(map[string]any)
	data := m["data"].(map[string]any)
	if m["token"] != good || android["collapse_key"] != nil || android["ttl"] != "3600s" || android["priority"] != "high" ||
		data["conv"] != "g1" || data["seq"] != "7" || data["badge"] != "5" || data["count"] != "2" || data["kind"] != "msg" {
		t.Fatalf("message %v", m)
	}
	b := testNotification(good, KindBadge)
	b.Ts = n.Ts
	if err := f.Send(ctx, b); err != nil {
		t.Fatal(err)
	}
	if d := fake.messages[1]["data"].(map[string]any); d["kind"] != "badge" || d["conv"] != nil ||
		fake.messages[1]["android"].(map[string]any)["collapse_key"] != "badge" {
		t.Fatalf("badge message %v", fake.messages[1])
	}
	unreg, busy, down := fake.device("unreg", false), fake.device("busy", false), fake.device("down", false)
	fake.setDevice(unreg, func(d *fcmDevice) { d.unregistered = true })
	fake.setDevice(busy, func(d *fcmDevice) { d.status = http.StatusTooManyRequests })
	fake.setDevice(down, func(d *fcmDevice) { d.status = http.StatusServiceUnavailable })
	const invalid = "not-a-registration-token"
	for token, want := range map[string]string{unreg: ReasonBadToken, invalid: ReasonBadToken, busy: ReasonThrottled, down: ReasonUnavailable} {
		reason, after := reasonOf(f.Send(ctx, testNotification(token, KindMsg)))
		if reason != want {
			t.Errorf("token %s: reason %s, want %s", token, reason, want)
		}
		if token == busy && after != 3*time.Second {
			t.Errorf("Retry-After %v, want 3s", after)
		}
	}
	if fake.issued != 1 {
		t.Fatalf("%d access tokens fetched, want 1 (reused until it expires)", fake.issued)
	}
}

// TestFCMCollapseKeys: FCM keeps four collapse keys per device; an
// offline device with messages of six conversations gets all six when it
// comes online, and of three badge notifications the newest.
func TestFCMCollapseKeys(t *testing.T) {
	t.Parallel()
	f, fake := newFCMPair(t, time.Now())
	phone := fake.device("phone", false)
	fake.setOnline(phone, false)
	ctx := context.Background()
	for i := range 6 {
		n := testNotification(phone, KindMsg)
		n.Conv, n.Key = fmt.Sprint("c", i), fmt.Sprintf("d1:c%d:7", i)
		if err := f.Send(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	for badge := range int64(3) {
		n := testNotification(phone, KindBadge)
		n.Badge = badge
		if err := f.Send(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	fake.setOnline(phone, true)
	convs, badges := map[string]bool{}, []string{}
	for _, m := range fake.deliveredTo(phone) {
		d := m["data"].(map[string]any)
		if d["kind"] == "badge" {
			badges = append(badges, d["badge"].(string))
		} else {
			convs[d["conv"].(string)] = true
		}
	}
	if len(convs) != 6 || !reflect.DeepEqual(badges, []string{"2"}) {
		t.Fatalf("an offline device got the messages of %d conversations of 6 and badges %v (want the newest only)", len(convs), badges)
	}
}

// TestFCMApple: an Apple device registered through FCM gets what APNs
// needs: an alert for a message (priority 10, collapsed per
// conversation), an alert push with only the badge for a badge update,
// a background push (content-available, priority 5) for a recall; each
// expires notify_ttl after the commit, and the data keys stand beside
// aps.
func TestFCMApple(t *testing.T) {
	t.Parallel()
	now := time.Now()
	f, fake := newFCMPair(t, now)
	iphone := fake.device("iphone", true)
	ctx := context.Background()
	type want struct {
		pushType, priority string
		aps                map[string]any
	}
	for kind, w := range map[string]want{
		KindMsg: {"alert", "10", map[string]any{"alert": map[string]any{"title": "Team", "body": "2 new messages"},
			"badge": json.Number("5"), "sound": "default", "thread-id": "g1"}},
		KindBadge:  {"alert", "5", map[string]any{"badge": json.Number("5")}},
		KindRecall: {"background", "5", map[string]any{"content-available": json.Number("1")}},
	} {
		n := testNotification(iphone, kind)
		n.Ts = now.Add(-10 * time.Minute).UnixMilli()
		if err := f.Send(ctx, n); err != nil {
			t.Fatal(err)
		}
		got := fake.deliveredTo(iphone)
		if len(got) == 0 {
			t.Fatalf("%s: not delivered (APNs dropped: %v)", kind, fake.droppedFor(iphone))
		}
		h := got[len(got)-1]["headers"].(map[string]string)
		payload := got[len(got)-1]["payload"].(map[string]any)
		exp := strconv.FormatInt(time.UnixMilli(n.Ts).Add(time.Hour).Unix(), 10)
		if h["apns-push-type"] != w.pushType || h["apns-priority"] != w.priority || h["apns-expiration"] != exp ||
			!reflect.DeepEqual(payload["aps"], w.aps) || payload["kind"] != kind {
			t.Errorf("%s: headers %v payload %v; want %s priority %s expiring %s aps %v", kind, h, payload, w.pushType, w.priority, exp, w.aps)
		}
		if (kind == KindMsg) != (h["apns-collapse-id"] == "g1") {
			t.Errorf("%s: apns-collapse-id %q", kind, h["apns-collapse-id"])
		}
		fake.setDevice(iphone, func(d *fcmDevice) { d.delivered = nil })
	}
	if d := fake.droppedFor(iphone); len(d) > 0 {
		t.Fatalf("APNs would not deliver: %v", d)
	}
}

// TestFCMPayloadLimit: a title too long for FCM's 4096 bytes of data
// (and an Apple device's APNs payload) is cut on a character boundary,
// ending with "…", and the message is delivered.
func TestFCMPayloadLimit(t *testing.T) {
	t.Parallel()
	f, fake := newFCMPair(t, time.Now())
	for _, ios := range []bool{false, true} {
		tok := fake.device(fmt.Sprint("d-", ios), ios)
		n := testNotification(tok, KindMsg)
		n.Title = strings.Repeat("日", 2000) // 6000 bytes
		n.Preview = "see you <b>there</b> & then"
		if err := f.Send(context.Background(), n); err != nil {
			t.Fatalf("ios %v: %v", ios, err)
		}
		got := fake.deliveredTo(tok)
		if len(got) != 1 {
			t.Fatalf("ios %v: delivered %d", ios, len(got))
		}
		data := got[0]["data"]
		if ios {
			data = got[0]["payload"]
		}
		d := data.(map[string]any)
		title, _ := d["title"].(string)
		if !utf8.ValidString(title) || !strings.HasSuffix(title, "…") || !strings.HasPrefix(n.Title, strings.TrimSuffix(title, "…")) ||
			d["preview"] != n.Preview {
			t.Fatalf("ios %v: title of %d bytes %q…, preview %q", ios, len(title), cutUTF8(title, 12), d["preview"])
		}
	}
}

// TestFCMExpiration: android.ttl is what is left of notify_ttl since the
// commit, whichever attempt sends it.
func TestFCMExpiration(t *testing.T) {
	t.Parallel()
	now := time.UnixMilli(time.Now().UnixMilli())
	f, fake := newFCMPair(t, now)
	phone := fake.device("phone", false)
	n := testNotification(phone, KindMsg)
	n.Ts = now.Add(-30 * time.Minute).UnixMilli()
	if err := f.Send(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	if ttl := fake.messages[0]["android"].(map[string]any)["ttl"]; ttl != "1800s" {
		t.Fatalf("ttl %v half an hour after the commit, want 1800s", ttl)
	}
	n.Ts = now.Add(-2 * time.Hour).UnixMilli()
	if err := f.Send(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	if ttl := fake.messages[1]["android"].(map[string]any)["ttl"]; ttl != "0s" {
		t.Fatalf("ttl %v past notify_ttl, want 0s", ttl)
	}
}

// TestFCMAccessTokenRevoked: an access token FCM no longer takes (401
// UNAUTHENTICATED) is replaced by a new one and the message sent again;
// a service account the token endpoint refuses is a configuration error.
func TestFCMAccessTokenRevoked(t *testing.T) {
	t.Parallel()
	f, fake := newFCMPair(t, time.Now())
	phone := fake.device("phone", false)
	ctx := context.Background()
	if err := f.Send(ctx, testNotification(phone, KindMsg)); err != nil {
		t.Fatal(err)
	}
	fake.revoke()
	if err := f.Send(ctx, testNotification(phone, KindMsg)); err != nil {
		t.Fatalf("after the access token was revoked: %v", err)
	}
	if fake.issued != 2 || len(fake.deliveredTo(phone)) != 2 {
		t.Fatalf("%d access tokens, %d delivered; want 2 and 2", fake.issued, len(fake.deliveredTo(phone)))
	}
	fake.revoke()
	fake.setKey(&rsaKey(t).PublicKey) // the service account's key is no longer the project's
	if reason, _ := reasonOf(f.Send(ctx, testNotification(phone, KindMsg))); reason != ReasonConfig {
		t.Fatalf("service account refused: %s, want config", reason)
	}
}

// TestFCMErrors: FCM's documented error answers are classified by their
// code and field, not by words of their message: only UNREGISTERED and an
// invalid registration token remove the registration; SENDER_ID_MISMATCH
// and THIRD_PARTY_AUTH_ERROR are configuration errors.
func TestFCMErrors(t *testing.T) {
	t.Parallel()
	var answer struct {
		status int
		body   string
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/token" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"access_token":"a","token_type":"Bearer","expires_in":3600}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(answer.status)
		_, _ = w.Write([]byte(answer.body))
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	path, _ := writeServiceAccount(t, srv.URL+"/token")
	f, err := NewFCM(FCMConfig{Endpoint: srv.URL, CredentialsFile: path, TTL: time.Hour}, prodClient(srv))
	if err != nil {
		t.Fatal(err)
	}
	status := func(code int, status, message string, details ...string) string {
		return fmt.Sprintf(`{"error":{"code":%d,"message":%q,"status":%q,"details":[%s]}}`, code, message, status, strings.Join(details, ","))
	}
	fcmErr := func(code string) string {
		return `{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"` + code + `"}`
	}
	field := func(f string) string {
		return `{"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"field":"` + f + `","description":"x"}]}`
	}
	for _, c := range []struct {
		name   string
		status int
		body   string
		want   string
	}{
		{"documented invalid token", 400, status(400, "INVALID_ARGUMENT", fcmInvalidToken, fcmErr("INVALID_ARGUMENT")), ReasonBadToken},
		{"violation on message.token", 400, status(400, "INVALID_ARGUMENT", "Invalid value", field("message.token")), ReasonBadToken},
		{"data value, text naming a token", 400, status(400, "INVALID_ARGUMENT", "Invalid value at 'message.data[0].value' (TYPE_STRING) for the registration token's app",
			field("message.data[0].value")), ReasonRejected},
		{"message too big", 400, status(400, "INVALID_ARGUMENT", "Message is too big for the token", fcmErr("INVALID_ARGUMENT"), field("message")), ReasonRejected},
		{"unregistered", 404, status(404, "NOT_FOUND", "Requested entity was not found.", fcmErr("UNREGISTERED")), ReasonBadToken},
		{"sender id mismatch", 403, status(403, "PERMISSION_DENIED", "SenderId mismatch", fcmErr("SENDER_ID_MISMATCH")), ReasonConfig},
		{"third party auth", 401, status(401, "UNAUTHENTICATED", "Auth error from APNS or Web Push Service", fcmErr("THIRD_PARTY_AUTH_ERROR")), ReasonConfig},
		{"quota", 429, status(429, "RESOURCE_EXHAUSTED", "Quota exceeded.", fcmErr("QUOTA_EXCEEDED")), ReasonThrottled},
		{"internal", 500, status(500, "INTERNAL", "Internal error.", fcmErr("INTERNAL")), ReasonUnavailable},
	} {
		answer.status, answer.body = c.status, c.body
		if reason, _ := reasonOf(f.Send(context.Background(), testNotification("tok", KindMsg))); reason != c.want {
			t.Errorf("%s: %s, want %s", c.name, reason, c.want)
		}
	}
}

// TestFCMSenderIDMismatch: a registration token of another Firebase
// project (a wrong fcm_credentials_file) is a configuration error.
func TestFCMSenderIDMismatch(t *testing.T) {
	t.Parallel()
	f, fake := newFCMPair(t, time.Now())
	stray := fake.device("stray", false)
	fake.setDevice(stray, func(d *fcmDevice) { d.project = "another-project" })
	if reason, _ := reasonOf(f.Send(context.Background(), testNotification(stray, KindMsg))); reason != ReasonConfig {
		t.Fatalf("SENDER_ID_MISMATCH: %s, want config", reason)
	}
}

// TestWebhookSignature: the signature is the documented HMAC, and a
// receiver's check (as docs/notifications.md shows it) accepts it.
func TestWebhookSignature(t *testing.T) {
	t.Parallel()
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
