package notify

import (
	"bytes"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// fcmDevice is an app install the fake FCM knows.
type fcmDevice struct {
	ios          bool   // an Apple device: it gets what APNs would make of the message
	project      string // the Firebase project it registered with
	unregistered bool   // 404 UNREGISTERED
	status       int    // answer this status instead (429, 503)
	offline      bool
	pending      []fcmStored // kept while offline
	delivered    []map[string]any
	dropped      []string // Apple devices: pushes APNs took and did not deliver, and why
	deleted      int      // times the stored messages were discarded (onDeletedMessages)
}

type fcmStored struct {
	collapseKey string
	msg         map[string]any
}

// fakeFCM is a service account's OAuth2 token endpoint and the FCM HTTP
// v1 API as Google documents them ("projects.messages", "AndroidConfig",
// "ApnsConfig", "ErrorCode", "Set the lifespan of a message",
// "Non-collapsible and collapsible messages"), over HTTP/2 with TLS:
//   - the token endpoint checks the service account's signed assertion
//     and issues access tokens valid for an hour;
//   - messages:send takes only a live access token of the project (401
//     UNAUTHENTICATED otherwise: unknown, revoked or expired);
//   - the message has a token; data values are strings (400
//     INVALID_ARGUMENT, BadRequest on message.data[i].value), keys are
//     not FCM's own (from, message_type, gcm…, google…), keys and values
//     are 4096 bytes at most; android.priority is normal or high;
//     android.ttl is a duration string ("3600s") of 0 to 4 weeks; apns
//     headers are strings;
//   - a token FCM never issued is 400 INVALID_ARGUMENT with the
//     documented invalid-token message, a token of another project 403
//     SENDER_ID_MISMATCH, an unregistered one 404 UNREGISTERED;
//   - errors are google.rpc.Status with FcmError / BadRequest details;
//   - an offline Android device's messages are kept as FCM keeps them:
//     collapsible ones by collapse key, four keys at most (a fifth key
//     replaces the oldest), up to 100 non-collapsible ones (the 101st
//     discards them all); they are delivered when it comes online;
//   - an Apple device gets the APNs push FCM makes of the message: the
//     apns headers (apns-priority 10 and apns-expiration 30 days unless
//     set) and apns.payload with the data keys beside aps, judged by
//     checkAPNsPush (a refused push is 400 INVALID_ARGUMENT on
//     message.apns; one APNs would not deliver is taken and dropped).
type fakeFCM struct {
	t   *testing.T
	srv *httptest.Server
	pub *rsa.PublicKey

	mu        sync.Mutex
	issued    int
	access    map[string]time.Time // live access tokens and when they expire
	messages  []map[string]any     // every message taken
	devices   map[string]*fcmDevice
	notH2     int // requests not over HTTP/2
	refusedBy map[string]int
}

func newFakeFCM(t *testing.T, pub *rsa.PublicKey) *fakeFCM {
	f := &fakeFCM{t: t, pub: pub, access: map[string]time.Time{}, devices: map[string]*fcmDevice{}, refusedBy: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /token", f.token)
	mux.HandleFunc("POST /v1/projects/{project}/messages:send", f.send)
	f.srv = httptest.NewUnstartedServer(mux)
	f.srv.EnableHTTP2 = true
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	t.Cleanup(func() {
		if f.notH2 > 0 {
			t.Errorf("%d FCM requests not over HTTP/2", f.notH2)
		}
	})
	return f
}

// device makes an app install and returns its registration token.
func (f *fakeFCM) device(name string, ios bool) string {
	tok := "fcm-" + name + ":APA91b" + strings.Repeat("x", 140)
	f.mu.Lock()
	f.devices[tok] = &fcmDevice{ios: ios, project: "parley-test"}
	f.mu.Unlock()
	return tok
}

func (f *fakeFCM) setDevice(tok string, set func(d *fcmDevice)) {
	f.mu.Lock()
	set(f.devices[tok])
	f.mu.Unlock()
}

// setOnline connects or disconnects a device; coming online it gets
// what FCM kept for it.
func (f *fakeFCM) setOnline(tok string, online bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.devices[tok]
	d.offline = !online
	if online {
		for _, p := range d.pending {
			d.delivered = append(d.delivered, p.msg)
		}
		d.pending = nil
	}
}

func (f *fakeFCM) deliveredTo(tok string) []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.devices[tok].delivered)
}

func (f *fakeFCM) droppedFor(tok string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.devices[tok].dropped)
}

// setKey makes pub the service account's public key.
func (f *fakeFCM) setKey(pub *rsa.PublicKey) {
	f.mu.Lock()
	f.pub = pub
	f.mu.Unlock()
}

// revoke makes every access token issued so far invalid.
func (f *fakeFCM) revoke() {
	f.mu.Lock()
	clear(f.access)
	f.mu.Unlock()
}

func (f *fakeFCM) refusals(status string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refusedBy[status]
}

func (f *fakeFCM) token(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 2 {
		f.mu.Lock()
		f.notH2++
		f.mu.Unlock()
	}
	if r.FormValue("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
		f.t.Errorf("grant_type %q", r.FormValue("grant_type"))
	}
	f.mu.Lock()
	pub := f.pub
	f.mu.Unlock()
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(r.FormValue("assertion"), claims, func(*jwt.Token) (any, error) { return pub, nil },
		jwt.WithValidMethods([]string{"RS256"}), jwt.WithAudience(f.srv.URL+"/token"), jwt.WithIssuer("notify@parley-test.iam.gserviceaccount.com"))
	if errors.Is(err, jwt.ErrTokenSignatureInvalid) {
		// A key the project no longer has (deleted or rotated).
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":"invalid_grant","error_description":"Invalid JWT Signature."}`))
		return
	}
	if err != nil || claims["scope"] != fcmScope {
		f.t.Errorf("assertion: %v (claims %v)", err, claims)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.issued++
	tok := "access-" + strconv.Itoa(f.issued)
	f.access[tok] = time.Now().Add(time.Hour)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": tok, "token_type": "Bearer", "expires_in": 3600})
}

// fcmDetail is one entry of a google.rpc.Status's details.
type fcmDetail map[string]any

func fcmCode(code string) fcmDetail {
	return fcmDetail{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": code}
}

func badRequest(field, description string) fcmDetail {
	return fcmDetail{"@type": "type.googleapis.com/google.rpc.BadRequest",
		"fieldViolations": []map[string]string{{"field": field, "description": description}}}
}

// fail answers a google.rpc.Status.
func (f *fakeFCM) fail(w http.ResponseWriter, code int, status, message string, details ...fcmDetail) {
	f.mu.Lock()
	f.refusedBy[status]++
	f.mu.Unlock()
	if details == nil {
		details = []fcmDetail{}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": message, "status": status, "details": details}})
}

// invalid answers 400 INVALID_ARGUMENT on field.
func (f *fakeFCM) invalid(w http.ResponseWriter, field, message string) {
	f.fail(w, 400, "INVALID_ARGUMENT", message, fcmCode("INVALID_ARGUMENT"), badRequest(field, message))
}

var fcmDuration = regexp.MustCompile(`^([0-9]+)(\.[0-9]{1,9})?s$`)

func (f *fakeFCM) send(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 2 {
		f.mu.Lock()
		f.notH2++
		f.mu.Unlock()
	}
	bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	f.mu.Lock()
	exp, live := f.access[bearer]
	f.mu.Unlock()
	if !live || time.Now().After(exp) {
		f.fail(w, 401, "UNAUTHENTICATED", "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.")
		return
	}
	if r.PathValue("project") != "parley-test" {
		f.fail(w, 403, "PERMISSION_DENIED", "Permission 'cloudmessaging.messages.create' denied on resource")
		return
	}
	var body struct {
		Message map[string]any `json:"message"`
	}
	dec := json.NewDecoder(r.Body)
	dec.UseNumber()
	if err := dec.Decode(&body); err != nil || body.Message == nil {
		f.invalid(w, "message", "Invalid JSON payload received.")
		return
	}
	m := body.Message
	tok, _ := m["token"].(string)
	if tok == "" {
		f.invalid(w, "message.token", "Recipient of the message is not set.")
		return
	}
	data := map[string]string{}
	if raw, ok := m["data"]; ok {
		obj, ok := raw.(map[string]any)
		if !ok {
			f.invalid(w, "message.data", "Invalid value at 'message.data'")
			return
		}
		keys := slices.Sorted(func(yield func(string) bool) {
			for k := range obj {
				if !yield(k) {
					return
				}
			}
		})
		size := 0
		for i, k := range keys {
			s, ok := obj[k].(string)
			if !ok {
				msg := fmt.Sprintf("Invalid value at 'message.data[%d].value' (TYPE_STRING), %v", i, obj[k])
				f.fail(w, 400, "INVALID_ARGUMENT", msg, badRequest(fmt.Sprintf("message.data[%d].value", i), msg))
				return
			}
			if k == "from" || k == "message_type" || strings.HasPrefix(k, "gcm") || strings.HasPrefix(k, "google") {
				f.invalid(w, "message.data", "Invalid data payload key: "+k)
				return
			}
			data[k] = s
			size += len(k) + len(s)
		}
		if size > fcmDataMax {
			f.invalid(w, "message", fmt.Sprintf("Message is too big: %d bytes of data, at most %d", size, fcmDataMax))
			return
		}
	}
	collapseKey := ""
	if raw, ok := m["android"]; ok {
		a, ok := raw.(map[string]any)
		if !ok {
			f.invalid(w, "message.android", "Invalid value at 'message.android'")
			return
		}
		if p, ok := a["priority"]; ok {
			switch p {
			case "normal", "high", "NORMAL", "HIGH":
			default:
				f.invalid(w, "message.android.priority", fmt.Sprintf("Invalid value at 'message.android.priority' (type.googleapis.com/google.firebase.fcm.v1.AndroidConfig.AndroidMessagePriority), %v", p))
				return
			}
		}
		if ttl, ok := a["ttl"]; ok {
			s, _ := ttl.(string)
			mm := fcmDuration.FindStringSubmatch(s)
			if mm == nil {
				f.invalid(w, "message.android.ttl", fmt.Sprintf("Invalid value at 'message.android.ttl' (type.googleapis.com/google.protobuf.Duration), %v", ttl))
				return
			}
			if secs, err := strconv.ParseInt(mm[1], 10, 64); err != nil || secs > int64(fcmTTLMax/time.Second) || secs == int64(fcmTTLMax/time.Second) && mm[2] != "" {
				f.invalid(w, "message.android.ttl", "The TTL must be between 0 and 2419200 seconds (4 weeks)")
				return
			}
		}
		if ck, ok := a["collapse_key"]; ok {
			if collapseKey, ok = ck.(string); !ok {
				f.invalid(w, "message.android.collapse_key", "Invalid value at 'message.android.collapse_key' (TYPE_STRING)")
				return
			}
		}
	}
	apnsHeaders := map[string]string{}
	apnsPayload := map[string]any{}
	if raw, ok := m["apns"]; ok {
		a, ok := raw.(map[string]any)
		if !ok {
			f.invalid(w, "message.apns", "Invalid value at 'message.apns'")
			return
		}
		if hs, ok := a["headers"].(map[string]any); ok {
			for k, v := range hs {
				s, ok := v.(string)
				if !ok {
					f.invalid(w, "message.apns.headers", fmt.Sprintf("Invalid value at 'message.apns.headers[%s]' (TYPE_STRING)", k))
					return
				}
				apnsHeaders[strings.ToLower(k)] = s
			}
		}
		if p, ok := a["payload"].(map[string]any); ok {
			apnsPayload = p
		}
	}
	f.mu.Lock()
	d := f.devices[tok]
	f.mu.Unlock()
	switch {
	case d == nil:
		f.fail(w, 400, "INVALID_ARGUMENT", fcmInvalidToken, fcmCode("INVALID_ARGUMENT"))
		return
	case d.project != "parley-test":
		f.fail(w, 403, "PERMISSION_DENIED", "SenderId mismatch", fcmCode("SENDER_ID_MISMATCH"))
		return
	case d.unregistered:
		f.fail(w, 404, "NOT_FOUND", "Requested entity was not found.", fcmCode("UNREGISTERED"))
		return
	case d.status == http.StatusTooManyRequests:
		w.Header().Set("Retry-After", "3")
		f.fail(w, 429, "RESOURCE_EXHAUSTED", "Quota exceeded.", fcmCode("QUOTA_EXCEEDED"))
		return
	case d.status != 0:
		f.fail(w, d.status, "UNAVAILABLE", "The service is currently unavailable.", fcmCode("UNAVAILABLE"))
		return
	}
	if d.ios {
		// The push FCM makes for APNs: its defaults, and the data keys
		// beside aps.
		if apnsHeaders["apns-priority"] == "" {
			apnsHeaders["apns-priority"] = "10"
		}
		if apnsHeaders["apns-expiration"] == "" {
			apnsHeaders["apns-expiration"] = strconv.FormatInt(time.Now().Add(30*24*time.Hour).Unix(), 10)
		}
		if apnsHeaders["apns-push-type"] == "" {
			apnsHeaders["apns-push-type"] = "alert"
		}
		payload := map[string]any{}
		for k, v := range apnsPayload {
			payload[k] = v
		}
		for k, v := range data {
			payload[k] = v
		}
		if payload["aps"] == nil {
			payload["aps"] = map[string]any{}
		}
		raw := marshal(payload)
		raw = append(raw, bytes.Repeat([]byte(" "), fcmAPNsReserve)...) // what FCM adds (gcm.message_id, google.c.*)
		v := checkAPNsPush(func(h string) string { return apnsHeaders[h] }, raw)
		if v.status != http.StatusOK {
			f.invalid(w, "message.apns", "APNs refused the push: "+v.reason)
			return
		}
		f.mu.Lock()
		f.messages = append(f.messages, m)
		if v.dropped != "" {
			d.dropped = append(d.dropped, v.dropped)
		} else {
			d.delivered = append(d.delivered, map[string]any{"headers": apnsHeaders, "payload": payload})
		}
		f.mu.Unlock()
	} else {
		f.mu.Lock()
		f.messages = append(f.messages, m)
		switch {
		case !d.offline:
			d.delivered = append(d.delivered, m)
		case collapseKey != "":
			i := slices.IndexFunc(d.pending, func(p fcmStored) bool { return p.collapseKey == collapseKey })
			if i >= 0 {
				d.pending = slices.Delete(d.pending, i, i+1)
			} else if keys := countKeys(d.pending); keys == 4 {
				oldest := slices.IndexFunc(d.pending, func(p fcmStored) bool { return p.collapseKey != "" })
				d.pending = slices.Delete(d.pending, oldest, oldest+1)
			}
			d.pending = append(d.pending, fcmStored{collapseKey: collapseKey, msg: m})
		default:
			if len(d.pending)-countKeys(d.pending) == 100 {
				d.pending = slices.DeleteFunc(d.pending, func(p fcmStored) bool { return p.collapseKey == "" })
				d.deleted++
			}
			d.pending = append(d.pending, fcmStored{msg: m})
		}
		f.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"name":"projects/parley-test/messages/0:%d"}`, time.Now().UnixNano())
}

// countKeys is how many collapse keys pending holds.
func countKeys(pending []fcmStored) int {
	n := 0
	for _, p := range pending {
		if p.collapseKey != "" {
			n++
		}
	}
	return n
}

// TestFakeFCMRules: the fake FCM refuses what Google documents it
// refuses, with its status and google.rpc.Status details, and an Apple
// device gets nothing of a data-only message without an apns block.
func TestFakeFCMRules(t *testing.T) {
	t.Parallel()
	f, fake := newFCMPair(t, time.Now())
	android := fake.device("android", false)
	iphone := fake.device("iphone", true)
	stray := fake.device("stray", false)
	fake.setDevice(stray, func(d *fcmDevice) { d.project = "another-project" })
	access, err := f.accessToken("")
	if err != nil {
		t.Fatal(err)
	}
	client := prodClient(fake.srv)
	type answer struct {
		Error struct {
			Code    int
			Status  string
			Message string
			Details []map[string]any
		}
	}
	big := strings.Repeat("x", fcmDataMax)
	for _, c := range []struct {
		name        string
		bearer      string
		message     string
		status      int
		code, field string // FcmError errorCode, BadRequest field
	}{
		{name: "valid", message: `{"token":%q,"data":{"a":"1"},"android":{"priority":"high","ttl":"3600s"}}`, status: 200},
		{name: "ttl 0s", message: `{"token":%q,"android":{"ttl":"0s"}}`, status: 200},
		{name: "ttl 3.5s", message: `{"token":%q,"android":{"ttl":"3.5s"}}`, status: 200},
		{name: "ttl of 4 weeks", message: `{"token":%q,"android":{"ttl":"2419200s"}}`, status: 200},
		{name: "ttl over 4 weeks", message: `{"token":%q,"android":{"ttl":"2419201s"}}`, status: 400, code: "INVALID_ARGUMENT", field: "message.android.ttl"},
		{name: "ttl not a duration string", message: `{"token":%q,"android":{"ttl":"1h"}}`, status: 400, code: "INVALID_ARGUMENT", field: "message.android.ttl"},
		{name: "ttl a number", message: `{"token":%q,"android":{"ttl":3600}}`, status: 400, code: "INVALID_ARGUMENT", field: "message.android.ttl"},
		{name: "priority urgent", message: `{"token":%q,"android":{"priority":"urgent"}}`, status: 400, code: "INVALID_ARGUMENT", field: "message.android.priority"},
		{name: "data value a number", message: `{"token":%q,"data":{"badge":5}}`, status: 400, field: "message.data[0].value"},
		{name: "data key from", message: `{"token":%q,"data":{"from":"x"}}`, status: 400, code: "INVALID_ARGUMENT", field: "message.data"},
		{name: "data key google.x", message: `{"token":%q,"data":{"google.x":"x"}}`, status: 400, code: "INVALID_ARGUMENT", field: "message.data"},
		{name: "data over 4096 bytes", message: `{"token":%q,"data":{"b":"` + big + `"}}`, status: 400, code: "INVALID_ARGUMENT", field: "message"},
		{name: "apns header not a string", message: `{"token":%q,"apns":{"headers":{"apns-priority":5}}}`, status: 400, code: "INVALID_ARGUMENT", field: "message.apns.headers"},
		{name: "no token", message: `{"data":{"a":"1"}}%.0s`, status: 400, code: "INVALID_ARGUMENT", field: "message.token"},
		{name: "unknown token", message: `{"token":"nope%.0s"}`, status: 400, code: "INVALID_ARGUMENT"},
		{name: "token of another project", message: `{"token":"` + stray + `"%.0s}`, status: 403, code: "SENDER_ID_MISMATCH"},
		{name: "no access token", bearer: "-", message: `{"token":%q}`, status: 401},
		{name: "unknown access token", bearer: "ya29.forged", message: `{"token":%q}`, status: 401},
		{name: "apple: background at priority 10", message: `{"token":"` + iphone + `"%.0s,"apns":{"headers":{"apns-push-type":"background","apns-priority":"10"},"payload":{"aps":{"content-available":1}}}}`,
			status: 400, code: "INVALID_ARGUMENT", field: "message.apns"},
	} {
		r, _ := http.NewRequest(http.MethodPost, fake.srv.URL+"/v1/projects/parley-test/messages:send",
			strings.NewReader(`{"message":`+fmt.Sprintf(c.message, android)+`}`))
		switch c.bearer {
		case "":
			r.Header.Set("Authorization", "Bearer "+access)
		case "-":
		default:
			r.Header.Set("Authorization", "Bearer "+c.bearer)
		}
		resp, err := client.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		var a answer
		_ = json.NewDecoder(resp.Body).Decode(&a)
		resp.Body.Close()
		var code, field string
		for _, d := range a.Error.Details {
			switch d["@type"] {
			case "type.googleapis.com/google.firebase.fcm.v1.FcmError":
				code, _ = d["errorCode"].(string)
			case "type.googleapis.com/google.rpc.BadRequest":
				field, _ = d["fieldViolations"].([]any)[0].(map[string]any)["field"].(string)
			}
		}
		if resp.StatusCode != c.status || code != c.code || field != c.field || c.status != 200 && a.Error.Code != c.status {
			t.Errorf("%s: %d %s/%s %q, want %d %s/%s", c.name, resp.StatusCode, code, field, a.Error.Message, c.status, c.code, c.field)
		}
	}
	// A data-only message to an Apple device without an apns block: FCM
	// takes it, APNs gets an alert push with nothing to show.
	r, _ := http.NewRequest(http.MethodPost, fake.srv.URL+"/v1/projects/parley-test/messages:send",
		strings.NewReader(`{"message":{"token":"`+iphone+`","data":{"kind":"recall"}}}`))
	r.Header.Set("Authorization", "Bearer "+access)
	resp, err := client.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || len(fake.deliveredTo(iphone)) != 0 || len(fake.droppedFor(iphone)) != 1 {
		t.Fatalf("data-only to Apple: %d, delivered %d, dropped %v", resp.StatusCode, len(fake.deliveredTo(iphone)), fake.droppedFor(iphone))
	}
}
