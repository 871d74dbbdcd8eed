package notify

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// testClock is a settable clock shared by a provider and a fake service.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock { return &testClock{t: time.Now()} }

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// apnsVerdict is what Apple does with a push: refuse it (status and
// reason), or take it (200) and deliver it, or take it and, as Apple
// documents for pushes whose headers and payload disagree, not deliver
// it (dropped says why).
type apnsVerdict struct {
	status  int
	reason  string
	dropped string
}

var (
	apnsUUID      = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	apnsPushTypes = map[string]bool{"alert": true, "background": true, "location": true, "voip": true, "complication": true,
		"fileprovider": true, "mdm": true, "liveactivity": true, "pushtotalk": true, "widgets": true, "controls": true}
)

// checkAPNsPush applies Apple's rules ("Sending notification requests to
// APNs", "Generating a remote notification", "Pushing background updates
// to your App") to a push's headers and payload:
//   - apns-id, when present, is a canonical lowercase UUID (BadMessageId);
//   - apns-push-type is one of Apple's (InvalidPushType);
//   - apns-priority is 10 (the default), 5 or 1 (BadPriority), and 5 for
//     a background push ("using priority 10 is an error": BadPriority);
//   - apns-expiration is a Unix time in seconds or 0 (BadExpirationDate);
//   - apns-collapse-id is at most 64 bytes (BadCollapseId);
//   - the payload is not empty (PayloadEmpty), at most 4096 bytes (413
//     PayloadTooLarge), and a JSON object with an aps dictionary (Apple
//     names no reason for a malformed one: BadPayload here);
//   - a background push's aps holds content-available: 1 and none of
//     alert, badge and sound; an alert push's holds alert, badge or sound:
//     otherwise Apple takes the push and may not deliver it (dropped).
func checkAPNsPush(header func(string) string, payload []byte) apnsVerdict {
	if id := header("apns-id"); id != "" && !apnsUUID.MatchString(id) {
		return apnsVerdict{status: 400, reason: "BadMessageId"}
	}
	pushType := header("apns-push-type")
	if !apnsPushTypes[pushType] {
		return apnsVerdict{status: 400, reason: "InvalidPushType"}
	}
	priority := header("apns-priority")
	if priority == "" {
		priority = "10"
	}
	if priority != "10" && priority != "5" && priority != "1" || pushType == "background" && priority != "5" {
		return apnsVerdict{status: 400, reason: "BadPriority"}
	}
	if e := header("apns-expiration"); e != "" {
		if v, err := strconv.ParseInt(e, 10, 64); err != nil || v < 0 {
			return apnsVerdict{status: 400, reason: "BadExpirationDate"}
		}
	}
	if len(header("apns-collapse-id")) > apnsCollapseIDMax {
		return apnsVerdict{status: 400, reason: "BadCollapseId"}
	}
	switch {
	case len(payload) == 0:
		return apnsVerdict{status: 400, reason: "PayloadEmpty"}
	case len(payload) > apnsPayloadMax:
		return apnsVerdict{status: 413, reason: "PayloadTooLarge"}
	}
	var body struct {
		APS map[string]any `json:"aps"`
	}
	if err := json.Unmarshal(payload, &body); err != nil || body.APS == nil {
		return apnsVerdict{status: 400, reason: "BadPayload"}
	}
	_, alert := body.APS["alert"]
	_, badge := body.APS["badge"]
	_, sound := body.APS["sound"]
	switch pushType {
	case "background":
		if ca, _ := body.APS["content-available"].(float64); ca != 1 {
			return apnsVerdict{status: 200, dropped: "background push without content-available: 1"}
		}
		if alert || badge || sound {
			return apnsVerdict{status: 200, dropped: "background push with alert, badge or sound"}
		}
	case "alert":
		if !alert && !badge && !sound {
			return apnsVerdict{status: 200, dropped: "alert push with neither alert, badge nor sound"}
		}
	}
	return apnsVerdict{status: 200}
}

// apnsDevice is an app install the fake APNs knows.
type apnsDevice struct {
	topic  string
	goneAt int64 // Unix ms: since then the token is invalid (410 Unregistered)
	status int   // answer this status instead (429, 500)
}

// apnsPushRecord is a push the fake took.
type apnsPushRecord struct {
	token   string
	header  http.Header
	body    map[string]any
	size    int
	dropped string
}

// fakeAPNs is Apple's provider API as Apple documents it, over HTTP/2
// with TLS. Besides checkAPNsPush it enforces token authentication: an
// ES256 JWT with the key id KEY123 and the team TEAM42 as issuer
// (InvalidProviderToken), issued less than an hour ago by its clock
// (403 ExpiredProviderToken), and no connection's token changing more
// than once in 20 minutes (429 TooManyProviderTokenUpdates). Device
// tokens are hex strings of devices made with device; another token is
// 400 BadDeviceToken, a device of another topic 400
// DeviceTokenNotForTopic, an unregistered one 410 Unregistered with its
// timestamp.
type fakeAPNs struct {
	t     *testing.T
	srv   *httptest.Server
	pub   *ecdsa.PublicKey
	clock *testClock

	mu       sync.Mutex
	devices  map[string]*apnsDevice
	conns    map[string]apnsConn // by the client's address
	tokens   map[string]int      // provider tokens seen
	refused  map[string]int      // reasons of refusals
	pushes   []apnsPushRecord
	expireIt bool // answer the next request 403 ExpiredProviderToken
}

// apnsConn is the provider token a connection uses, and since when.
type apnsConn struct {
	token string
	since time.Time
}

func newFakeAPNs(t *testing.T, pub *ecdsa.PublicKey, clock *testClock) *fakeAPNs {
	f := &fakeAPNs{t: t, pub: pub, clock: clock, devices: map[string]*apnsDevice{}, conns: map[string]apnsConn{},
		tokens: map[string]int{}, refused: map[string]int{}}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.srv.EnableHTTP2 = true
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

// device makes an app install of topic and returns its device token.
func (f *fakeAPNs) device(name, topic string) string {
	h := sha256.Sum256([]byte(name))
	tok := hex.EncodeToString(h[:])
	f.mu.Lock()
	f.devices[tok] = &apnsDevice{topic: topic}
	f.mu.Unlock()
	return tok
}

func (f *fakeAPNs) setDevice(tok string, set func(d *apnsDevice)) {
	f.mu.Lock()
	set(f.devices[tok])
	f.mu.Unlock()
}

func (f *fakeAPNs) refuse(w http.ResponseWriter, status int, reason string, extra ...any) {
	f.mu.Lock()
	f.refused[reason]++
	f.mu.Unlock()
	body := map[string]any{"reason": reason}
	for i := 0; i+1 < len(extra); i += 2 {
		body[extra[i].(string)] = extra[i+1]
	}
	w.Header().Set("content-type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func (f *fakeAPNs) refusals(reason string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refused[reason]
}

func (f *fakeAPNs) taken() []apnsPushRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]apnsPushRecord(nil), f.pushes...)
}

// last is the last push the fake took.
func (f *fakeAPNs) last() apnsPushRecord {
	p := f.taken()
	if len(p) == 0 {
		f.t.Fatal("no push taken")
	}
	return p[len(p)-1]
}

func (f *fakeAPNs) serve(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 2 {
		f.t.Errorf("APNs request over %s, want HTTP/2", r.Proto)
	}
	if r.Method != http.MethodPost {
		f.refuse(w, 405, "MethodNotAllowed")
		return
	}
	if !f.authorized(w, r) {
		return
	}
	payload, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	v := checkAPNsPush(r.Header.Get, payload)
	if v.status != 200 {
		f.refuse(w, v.status, v.reason)
		return
	}
	tok, ok := strings.CutPrefix(r.URL.Path, "/3/device/")
	f.mu.Lock()
	d := f.devices[tok]
	expire := f.expireIt
	f.expireIt = false
	f.mu.Unlock()
	topic := r.Header.Get("apns-topic")
	switch {
	case expire:
		f.refuse(w, 403, "ExpiredProviderToken")
	case !ok || tok == "":
		f.refuse(w, 400, "MissingDeviceToken")
	case d == nil:
		f.refuse(w, 400, "BadDeviceToken")
	case topic == "":
		f.refuse(w, 400, "MissingTopic")
	case topic != d.topic:
		f.refuse(w, 400, "DeviceTokenNotForTopic")
	case d.goneAt != 0:
		f.refuse(w, 410, "Unregistered", "timestamp", d.goneAt)
	case d.status == http.StatusTooManyRequests:
		w.Header().Set("Retry-After", "7")
		f.refuse(w, 429, "TooManyRequests")
	case d.status != 0:
		f.refuse(w, d.status, "InternalServerError")
	default:
		var body map[string]any
		_ = json.Unmarshal(payload, &body)
		f.mu.Lock()
		f.pushes = append(f.pushes, apnsPushRecord{token: tok, header: r.Header.Clone(), body: body, size: len(payload), dropped: v.dropped})
		f.mu.Unlock()
		if id := r.Header.Get("apns-id"); id != "" {
			w.Header().Set("apns-id", id)
		}
		w.WriteHeader(http.StatusOK)
	}
}

// authorized checks the provider token and the rules of its age and
// refresh rate; it answers the refusal itself.
func (f *fakeAPNs) authorized(w http.ResponseWriter, r *http.Request) bool {
	auth, ok := strings.CutPrefix(r.Header.Get("authorization"), "bearer ")
	if !ok || auth == "" {
		f.refuse(w, 403, "MissingProviderToken")
		return false
	}
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(auth, claims, func(tk *jwt.Token) (any, error) {
		if tk.Header["kid"] != "KEY123" {
			return nil, errors.New("wrong kid")
		}
		return f.pub, nil
	}, jwt.WithValidMethods([]string{"ES256"}), jwt.WithoutClaimsValidation()) // iat is checked by the fake's clock
	iat, _ := claims["iat"].(float64)
	if err != nil || iat == 0 || claims["iss"] != "TEAM42" {
		f.t.Errorf("provider token %q: %v", auth, err)
		f.refuse(w, 403, "InvalidProviderToken")
		return false
	}
	now := f.clock.now()
	if now.Sub(time.Unix(int64(iat), 0)) > time.Hour {
		f.refuse(w, 403, "ExpiredProviderToken")
		return false
	}
	f.mu.Lock()
	c, seen := f.conns[r.RemoteAddr]
	changed := seen && c.token != auth
	if changed && now.Sub(c.since) < 20*time.Minute {
		f.mu.Unlock()
		f.refuse(w, 429, "TooManyProviderTokenUpdates")
		return false
	}
	if !seen || changed {
		f.conns[r.RemoteAddr] = apnsConn{token: auth, since: now}
	}
	f.tokens[auth]++
	f.mu.Unlock()
	return true
}

// TestFakeAPNsRules: the fake APNs refuses what Apple documents it
// refuses, with Apple's status and reason, and takes without delivering
// what Apple documents it may not deliver.
func TestFakeAPNsRules(t *testing.T) {
	t.Parallel()
	p8, key := writeP8(t)
	_ = p8
	clock := newTestClock()
	fake := newFakeAPNs(t, &key.PublicKey, clock)
	good := fake.device("good", "im.parley.app")
	other := fake.device("other", "im.other.app")
	sign := func(iat time.Time) string {
		tk := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": "TEAM42", "iat": iat.Unix()})
		tk.Header["kid"] = "KEY123"
		s, err := tk.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	valid := `{"aps":{"alert":{"title":"t","body":"b"}}}`
	type req struct {
		name    string
		token   string
		auth    string
		header  map[string]string
		payload string
		status  int
		reason  string
		dropped string
	}
	base := func(r req) req {
		if r.token == "" {
			r.token = good
		}
		h := map[string]string{"apns-topic": "im.parley.app", "apns-push-type": "alert", "apns-priority": "10",
			"apns-id": "8e7b4c5f-2f1a-4c3d-9b8a-0123456789ab", "apns-expiration": "0"}
		for k, v := range r.header {
			h[k] = v
		}
		r.header = h
		if r.payload == "" {
			r.payload = valid
		}
		return r
	}
	cases := []req{
		{name: "valid", status: 200},
		{name: "apns-id not a UUID", header: map[string]string{"apns-id": "42"}, status: 400, reason: "BadMessageId"},
		{name: "apns-id in capitals", header: map[string]string{"apns-id": "8E7B4C5F-2F1A-4C3D-9B8A-0123456789AB"}, status: 400, reason: "BadMessageId"},
		{name: "unknown push type", header: map[string]string{"apns-push-type": "loud"}, status: 400, reason: "InvalidPushType"},
		{name: "priority 7", header: map[string]string{"apns-priority": "7"}, status: 400, reason: "BadPriority"},
		{name: "background at priority 10", header: map[string]string{"apns-push-type": "background"},
			payload: `{"aps":{"content-available":1}}`, status: 400, reason: "BadPriority"},
		{name: "expiration not a time", header: map[string]string{"apns-expiration": "tomorrow"}, status: 400, reason: "BadExpirationDate"},
		{name: "collapse id of 65 bytes", header: map[string]string{"apns-collapse-id": strings.Repeat("c", 65)}, status: 400, reason: "BadCollapseId"},
		{name: "collapse id of 64 bytes", header: map[string]string{"apns-collapse-id": strings.Repeat("c", 64)}, status: 200},
		{name: "empty payload", payload: " ", status: 400, reason: "BadPayload"},
		{name: "payload of 4097 bytes", payload: `{"aps":{"alert":"` + strings.Repeat("a", 4097-len(`{"aps":{"alert":""}}`)) + `"}}`, status: 413, reason: "PayloadTooLarge"},
		{name: "payload of 4096 bytes", payload: `{"aps":{"alert":"` + strings.Repeat("a", 4096-len(`{"aps":{"alert":""}}`)) + `"}}`, status: 200},
		{name: "background with a badge", header: map[string]string{"apns-push-type": "background", "apns-priority": "5"},
			payload: `{"aps":{"content-available":1,"badge":3}}`, status: 200, dropped: "background push with alert, badge or sound"},
		{name: "background without content-available", header: map[string]string{"apns-push-type": "background", "apns-priority": "5"},
			payload: `{"aps":{},"x":1}`, status: 200, dropped: "background push without content-available: 1"},
		{name: "alert with nothing to show", payload: `{"aps":{"content-available":1}}`, status: 200, dropped: "alert push with neither alert, badge nor sound"},
		{name: "badge-only alert at priority 5", header: map[string]string{"apns-priority": "5"}, payload: `{"aps":{"badge":0}}`, status: 200},
		{name: "unknown device token", token: strings.Repeat("ab", 32), status: 400, reason: "BadDeviceToken"},
		{name: "token of another topic", token: other, status: 400, reason: "DeviceTokenNotForTopic"},
		{name: "no topic", header: map[string]string{"apns-topic": ""}, status: 400, reason: "MissingTopic"},
		{name: "no provider token", auth: "-", status: 403, reason: "MissingProviderToken"},
		{name: "provider token 61 minutes old", auth: sign(clock.now().Add(-61 * time.Minute)), status: 403, reason: "ExpiredProviderToken"},
		{name: "another provider token 1 minute later", auth: sign(clock.now().Add(-time.Minute)), status: 429, reason: "TooManyProviderTokenUpdates"},
	}
	client := prodClient(fake.srv)
	first := sign(clock.now())
	for _, c := range cases {
		c = base(c)
		r, _ := http.NewRequest(http.MethodPost, fake.srv.URL+"/3/device/"+c.token, strings.NewReader(c.payload))
		for k, v := range c.header {
			if v != "" {
				r.Header.Set(k, v)
			}
		}
		switch c.auth {
		case "":
			r.Header.Set("authorization", "bearer "+first)
		case "-":
		default:
			r.Header.Set("authorization", "bearer "+c.auth)
		}
		before := len(fake.taken())
		resp, err := client.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		var reply struct{ Reason string }
		_ = json.NewDecoder(resp.Body).Decode(&reply)
		resp.Body.Close()
		if resp.StatusCode != c.status || reply.Reason != c.reason {
			t.Errorf("%s: %d %q, want %d %q", c.name, resp.StatusCode, reply.Reason, c.status, c.reason)
			continue
		}
		if c.status == 200 {
			p := fake.taken()
			if len(p) != before+1 || p[len(p)-1].dropped != c.dropped {
				t.Errorf("%s: taken %d (dropped %q), want dropped %q", c.name, len(p)-before, p[len(p)-1].dropped, c.dropped)
			}
		}
	}
}
