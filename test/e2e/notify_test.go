package e2e_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/notify"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
	"github.com/parley-im/parley/wire"
)

const sinkSecret = "sink-secret"

// sink is a webhook receiver that checks every request's signature and
// records the notifications by idempotency key. reply, if set, chooses
// the status (and headers) of each request.
type sink struct {
	t   *testing.T
	srv *httptest.Server

	mu    sync.Mutex
	got   []notify.WebhookPayload
	at    []time.Time // when each of got arrived
	keys  map[string]int
	reply func(p notify.WebhookPayload, n int, w http.ResponseWriter) bool // true: answered
}

func newSink(t *testing.T) *sink {
	s := &sink{t: t, keys: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *sink) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	ts := r.Header.Get(notify.HeaderTimestamp)
	if want := notify.Sign([]byte(sinkSecret), ts, body); r.Header.Get(notify.HeaderSignature) != want {
		s.t.Errorf("webhook signature %q, want %q", r.Header.Get(notify.HeaderSignature), want)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var p notify.WebhookPayload
	if err := json.Unmarshal(body, &p); err != nil {
		s.t.Errorf("webhook body %q: %v", body, err)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	key := r.Header.Get(notify.HeaderIdempotency)
	s.mu.Lock()
	s.keys[key]++
	n := s.keys[key]
	reply := s.reply
	s.mu.Unlock()
	if reply != nil && reply(p, n, w) {
		return
	}
	s.mu.Lock()
	s.got = append(s.got, p)
	s.at = append(s.at, time.Now())
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// when returns when the i-th accepted notification arrived.
func (s *sink) when(i int) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.at[i]
}

// received returns the notifications accepted so far.
func (s *sink) received() []notify.WebhookPayload {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]notify.WebhookPayload(nil), s.got...)
}

// of returns the accepted notifications to device.
func (s *sink) of(device string) []notify.WebhookPayload {
	var out []notify.WebhookPayload
	for _, p := range s.received() {
		if p.Device == device {
			out = append(out, p)
		}
	}
	return out
}

// waitFor waits until device received n notifications and returns them.
func (s *sink) waitFor(t *testing.T, device string, n int) []notify.WebhookPayload {
	t.Helper()
	testenv.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if got := len(s.of(device)); got < n {
			return fmt.Errorf("%s received %d notifications, want %d", device, got, n)
		}
		return nil
	})
	return s.of(device)
}

// notifyConfig is a test server's config with the webhook provider
// pointing at s and a short notify_delay.
func notifyConfig(t *testing.T, s *sink, delay time.Duration) config.Config {
	cfg := parleytest.Config(t)
	cfg.NotifyWebhookURL, cfg.NotifyWebhookSecret = s.srv.URL, sinkSecret
	cfg.NotifyDelay = delay
	cfg.AckCoalesce = 0
	return cfg
}

func register(t *testing.T, c *client.Conn, provider, token string) {
	t.Helper()
	if _, err := c.Do(ctx(t), wire.Request{T: wire.TNotifyRegister, Provider: provider, Token: token}); err != nil {
		t.Fatalf("notify_register: %v", err)
	}
}

// registeredOffline registers dev's webhook token and disconnects it.
func registeredOffline(t *testing.T, env *parleytest.Env, dev parleytest.Device) {
	t.Helper()
	c, _ := dial(t, env, dev)
	register(t, c, "webhook", "tok-"+dev.ID)
	c.Close()
}

// exactly checks that device received exactly n notifications once d
// passed (a nothing-more-happens check: none arrives in the meantime).
func (s *sink) exactly(t *testing.T, device string, n int, d time.Duration) {
	t.Helper()
	time.Sleep(d) // a nothing-more-happens check
	if got := s.of(device); len(got) != n {
		t.Fatalf("%s received %d notifications, want %d: %+v", device, len(got), n, got)
	}
}

// startNotify starts a server notifying s after delay, with users ana
// (one device) and ben (benDevices devices), both members of group g.
func startNotify(t *testing.T, s *sink, delay time.Duration, benDevices int) (env *parleytest.Env, ana, ben []parleytest.Device) {
	t.Helper()
	env = parleytest.Start(t, notifyConfig(t, s, delay))
	ana = env.User(t, "ana", 1)
	ben = env.User(t, "ben", benDevices)
	env.Group(t, "g", "ana", "ben")
	return env, ana, ben
}

// TestNotifyOfflineDevice: a registered device that is not connected is
// notified of a message once notify_delay passed: the signed webhook
// carries the message, count 1 and the exact badge, with the idempotency
// key (device, conv, seq).
func TestNotifyOfflineDevice(t *testing.T) {
	t.Parallel()
	s := newSink(t)
	env, ana, ben := startNotify(t, s, 300*time.Millisecond, 1)
	env.Group(t, "h", "ana", "ben")
	registeredOffline(t, env, ben[0])
	ca, _ := dial(t, env, ana[0])
	mustSend(t, ca, "h", "h1", []byte("older"))
	start := time.Now()
	m := mustSend(t, ca, "g", "c1", []byte("hello"))
	got := s.waitFor(t, ben[0].ID, 2)
	if time.Since(start) < 300*time.Millisecond {
		t.Fatalf("notified %v after the send, before notify_delay", time.Since(start))
	}
	var p notify.WebhookPayload
	for _, q := range got {
		if q.Conv == "g" {
			p = q
		}
	}
	if p.Kind != "msg" || p.Seq != m.Seq || p.Sender != "ana" || p.Count != 1 || p.User != "ben" || p.Token != "tok-"+ben[0].ID || p.Ts != m.Ts || p.Preview != "" {
		t.Fatalf("notification %+v for seq %d", p, m.Seq)
	}
	if p.Badge < 1 || p.Badge > 2 {
		t.Fatalf("badge %d, want ben's unread total (1 or 2)", p.Badge)
	}
	s.mu.Lock()
	n := s.keys[fmt.Sprintf("%s:g:%d", ben[0].ID, m.Seq)]
	s.mu.Unlock()
	if n != 1 {
		t.Fatalf("idempotency key seen %d times, want 1 (keys %v)", n, s.keys)
	}
	if got := s.of(ana[0].ID); len(got) != 0 {
		t.Fatalf("the sender was notified: %+v", got)
	}
}

// TestNotifyAckedInTimeNotNotified: a device that acks within notify_delay
// gets nothing; another device of the same user, connected but not
// acking (a backgrounded app), is notified.
func TestNotifyAckedInTimeNotNotified(t *testing.T) {
	t.Parallel()
	s := newSink(t)
	env, ana, ben := startNotify(t, s, 500*time.Millisecond, 2)
	b1, f1 := dial(t, env, ben[0])
	register(t, b1, "webhook", "tok1")
	b2, _ := dial(t, env, ben[1])
	register(t, b2, "webhook", "tok2")
	ca, _ := dial(t, env, ana[0])
	m := mustSend(t, ca, "g", "c1", []byte("hello"))
	waitPush(t, f1, "g", m.Seq)
	if _, err := b1.Ack(ctx(t), "g", m.Seq); err != nil {
		t.Fatal(err)
	}
	got := s.waitFor(t, ben[1].ID, 1)
	if got[0].Seq != m.Seq {
		t.Fatalf("backgrounded device got %+v", got)
	}
	s.exactly(t, ben[0].ID, 0, 300*time.Millisecond)
}

// TestNotifyMutedUnlessMentioned: a muted conversation notifies only
// messages that mention the user; mentions are stored with the event and
// users who are not members are dropped from them.
func TestNotifyMutedUnlessMentioned(t *testing.T) {
	t.Parallel()
	s := newSink(t)
	env, ana, ben := startNotify(t, s, 200*time.Millisecond, 1)
	env.User(t, "out", 0)
	cb, _ := dial(t, env, ben[0])
	register(t, cb, "webhook", "tok")
	until := time.Now().Add(time.Hour).UnixMilli()
	r, err := cb.Do(ctx(t), wire.Request{T: wire.TConvSettings, Conv: "g", MutedUntil: until})
	if err != nil || r.T != wire.TConvSettingsOK || r.Muted() != until || r.Conv != "g" {
		t.Fatalf("conv_settings: %+v %v", r, err)
	}
	convs, err := cb.Convs(ctx(t), 10, "")
	if err != nil || len(convs.Items) != 1 || convs.Items[0].MutedUntil != until {
		t.Fatalf("convs: %+v %v", convs, err)
	}
	cb.Close()
	ca, _ := dial(t, env, ana[0])
	mustSend(t, ca, "g", "plain", []byte("not for you"))
	m, err := ca.Do(ctx(t), wire.Request{T: wire.TSend, Conv: "g", Cmid: "ping", Body: []byte("@ben"), Mentions: []string{"ben", "out"}})
	if err != nil {
		t.Fatal(err)
	}
	got := s.waitFor(t, ben[0].ID, 1)
	if got[0].Seq != m.Seq || got[0].Count != 1 {
		t.Fatalf("muted conversation notified %+v, want only the mention seq %d", got, m.Seq)
	}
	page, err := ca.Sync(ctx(t), "g", m.Seq-1, 10)
	if err != nil || len(page.Events) != 1 || strings.Join(page.Events[0].Mentions, ",") != "ben" {
		t.Fatalf("stored mentions: %+v %v", page.Events, err)
	}
	s.exactly(t, ben[0].ID, 1, 300*time.Millisecond)
}

// TestNotifyPullTierOnlyMentions: in the pull tier only mentioned users'
// devices are notified (mention_all does not count).
func TestNotifyPullTierOnlyMentions(t *testing.T) {
	t.Parallel()
	s := newSink(t)
	cfg := notifyConfig(t, s, 200*time.Millisecond)
	cfg.WriteFanoutMax, cfg.OnlineFanoutMax = 2, 3
	cfg.MentionAllRate = 0
	env := parleytest.Start(t, cfg)
	ana := env.User(t, "ana", 1)
	users := []string{"ana"}
	var devs []parleytest.Device
	for _, u := range []string{"ben", "cat", "dan"} {
		d := env.User(t, u, 1)[0]
		devs = append(devs, d)
		users = append(users, u)
	}
	env.Group(t, "big", users...)
	for _, d := range devs {
		registeredOffline(t, env, d)
	}
	ca, _ := dial(t, env, ana[0])
	mustSend(t, ca, "big", "plain", []byte("x"))
	if _, err := ca.Do(ctx(t), wire.Request{T: wire.TSend, Conv: "big", Cmid: "all", Body: []byte("@all"), MentionAll: true}); err != nil {
		t.Fatal(err)
	}
	m, err := ca.Do(ctx(t), wire.Request{T: wire.TSend, Conv: "big", Cmid: "cat", Body: []byte("@cat"), Mentions: []string{"cat"}})
	if err != nil {
		t.Fatal(err)
	}
	got := s.waitFor(t, devs[1].ID, 1)
	if got[0].Seq != m.Seq {
		t.Fatalf("cat got %+v, want seq %d", got, m.Seq)
	}
	s.exactly(t, devs[0].ID, 0, 300*time.Millisecond)
	s.exactly(t, devs[2].ID, 0, 0)
}

// TestNotifyCollapse: messages of one conversation arriving together make
// one notification with the newest seq and their count; a later message
// makes the next one, at least notify_delay after it, counted from it.
func TestNotifyCollapse(t *testing.T) { // not parallel: it times notify_delay
	s := newSink(t)
	const delay = 300 * time.Millisecond
	env, ana, ben := startNotify(t, s, delay, 1)
	registeredOffline(t, env, ben[0])
	ca, _ := dial(t, env, ana[0])
	// Messages are evaluated together when their jobs fall due within the
	// merge window (a tenth of notify_delay, at most 50 ms); on a loaded
	// host the burst's commits can land further apart than that, and a
	// message was then notified alone. The notifier is held until every
	// job of the burst is due, so they are claimed together: what is
	// tested is that they then make one notification.
	release := env.Srv.HoldNotifications()
	defer release()
	// A burst: three sends in one write.
	var burst []any
	for i := range 3 {
		burst = append(burst, wire.Request{T: wire.TSend, Conv: "g", Cmid: fmt.Sprint("c", i), Body: []byte("x")})
	}
	if err := ca.WriteAll(burst...); err != nil {
		t.Fatal(err)
	}
	var head int64
	testenv.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		p, err := ca.Sync(ctx(t), "g", 0, 100)
		if err != nil || p.Head < 4 {
			return fmt.Errorf("head %d (%v)", p.Head, err)
		}
		head = p.Head
		return nil
	})
	time.Sleep(delay + 500*time.Millisecond) // on purpose: the burst's jobs are queued and fall due while held
	release()
	got := s.waitFor(t, ben[0].ID, 1)
	if got[0].Seq != head || got[0].Count != 3 {
		t.Fatalf("collapsed notification %+v, want seq %d count 3", got, head)
	}
	first := s.when(0)
	m := mustSend(t, ca, "g", "c3", []byte("x"))
	got = s.waitFor(t, ben[0].ID, 2)
	if got[1].Seq != m.Seq || got[1].Count != 1 || got[1].Badge != 4 {
		t.Fatalf("next notification %+v, want seq %d count 1 badge 4", got[1], m.Seq)
	}
	if gap := s.when(1).Sub(first); gap < delay-20*time.Millisecond {
		t.Fatalf("two notifications of one conversation %v apart, under notify_delay", gap)
	}
}

// TestNotifyRecallAndBadge: recalling a notified message sends a
// data-only recall to the device notified of it; reading on one device
// sends the new badge to the user's other, unconnected, notified device.
func TestNotifyRecallAndBadge(t *testing.T) {
	t.Parallel()
	s := newSink(t)
	env, ana, ben := startNotify(t, s, 300*time.Millisecond, 2)
	registeredOffline(t, env, ben[0])
	ca, _ := dial(t, env, ana[0])
	m1 := mustSend(t, ca, "g", "c1", []byte("oops"))
	m2 := mustSend(t, ca, "g", "c2", []byte("fine"))
	// The two usually make one notification; on a slow host m1 may be
	// notified alone first (its merge window ended before m2's commit),
	// and m2 a notify_delay later.
	var n int // notifications up to m2's
	testenv.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		for i, p := range s.of(ben[0].ID) {
			if p.Seq == m2.Seq {
				n = i + 1
				return nil
			}
		}
		return fmt.Errorf("no notification of seq %d yet: %+v", m2.Seq, s.of(ben[0].ID))
	})
	got := s.of(ben[0].ID)
	if n > 2 || got[n-1].Badge != 2 || (n == 2 && got[0].Seq != m1.Seq) {
		t.Fatalf("notifications of m1 (seq %d) and m2 (seq %d): %+v", m1.Seq, m2.Seq, got)
	}
	rc, err := ca.Recall(ctx(t), "g", m1.Seq)
	if err != nil {
		t.Fatal(err)
	}
	got = s.waitFor(t, ben[0].ID, n+1)
	if r := got[n]; r.Kind != "recall" || r.Seq != rc.Seq || r.Target != m1.Seq || r.Badge != 1 || r.Conv != "g" {
		t.Fatalf("recall notification %+v (recall seq %d of %d)", r, rc.Seq, m1.Seq)
	}
	// Ben reads everything on his tablet: the phone's badge goes to 0.
	tab, _ := dial(t, env, ben[1])
	if _, err := tab.Read(ctx(t), "g", m2.Seq+1); err != nil {
		t.Fatal(err)
	}
	got = s.waitFor(t, ben[0].ID, n+2)
	if b := got[n+1]; b.Kind != "badge" || b.Badge != 0 {
		t.Fatalf("badge notification %+v", b)
	}
	if got := s.of(ben[1].ID); len(got) != 0 {
		t.Fatalf("the unregistered tablet was notified: %+v", got)
	}
}

// TestNotifyTokenErrorRemovesRegistration: a webhook answering 410 for a
// token removes the device's registration.
func TestNotifyTokenErrorRemovesRegistration(t *testing.T) {
	t.Parallel()
	s := newSink(t)
	s.reply = func(p notify.WebhookPayload, _ int, w http.ResponseWriter) bool {
		if p.Token == "gone" {
			w.WriteHeader(http.StatusGone)
			return true
		}
		return false
	}
	env, ana, ben := startNotify(t, s, 200*time.Millisecond, 1)
	cb, _ := dial(t, env, ben[0])
	register(t, cb, "webhook", "gone")
	cb.Close()
	var dev struct {
		Notify *struct {
			Provider     string `json:"provider"`
			RegisteredAt int64  `json:"registered_at"`
		} `json:"notify"`
	}
	if st := env.Admin(t, "GET", "/v1/devices/"+ben[0].ID, nil, &dev); st != 200 || dev.Notify == nil || dev.Notify.Provider != "webhook" {
		t.Fatalf("device before: %d %+v", st, dev.Notify)
	}
	ca, _ := dial(t, env, ana[0])
	mustSend(t, ca, "g", "c1", []byte("x"))
	testenv.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		dev.Notify = nil
		env.Admin(t, "GET", "/v1/devices/"+ben[0].ID, nil, &dev)
		if dev.Notify != nil {
			return fmt.Errorf("still registered")
		}
		return nil
	})
	if n := env.Srv.MetricSum("parley_notify_dropped_total"); n != 1 {
		t.Fatalf("dropped %v, want 1", n)
	}
}

// TestNotifyRetryAfter: a 429 with Retry-After is retried after it, with
// the same idempotency key, and counted.
func TestNotifyRetryAfter(t *testing.T) {
	t.Parallel()
	s := newSink(t)
	var firstAt, secondAt time.Time
	s.reply = func(p notify.WebhookPayload, n int, w http.ResponseWriter) bool {
		if n == 1 {
			firstAt = time.Now()
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return true
		}
		secondAt = time.Now()
		return false
	}
	env, ana, ben := startNotify(t, s, 200*time.Millisecond, 1)
	registeredOffline(t, env, ben[0])
	ca, _ := dial(t, env, ana[0])
	m := mustSend(t, ca, "g", "c1", []byte("x"))
	got := s.waitFor(t, ben[0].ID, 1)
	if got[0].Seq != m.Seq {
		t.Fatalf("got %+v", got)
	}
	s.mu.Lock()
	wait := secondAt.Sub(firstAt)
	s.mu.Unlock()
	if wait < 900*time.Millisecond {
		t.Fatalf("retried %v after a 429 with Retry-After: 1", wait)
	}
	if n := env.Srv.MetricSum("parley_notify_failed_total"); n != 1 {
		t.Fatalf("failed %v, want 1", n)
	}
}

// TestNotifyLeftUserNotNotified: a user who left before the message is
// never notified of it.
func TestNotifyLeftUserNotNotified(t *testing.T) {
	t.Parallel()
	s := newSink(t)
	env := parleytest.Start(t, notifyConfig(t, s, 200*time.Millisecond))
	ana := env.User(t, "ana", 1)
	ben := env.User(t, "ben", 1)
	cat := env.User(t, "cat", 1)
	env.Group(t, "g", "ana", "ben", "cat")
	registeredOffline(t, env, ben[0])
	cc, _ := dial(t, env, cat[0])
	register(t, cc, "webhook", "tok-cat")
	if _, err := cc.Leave(ctx(t), "g"); err != nil {
		t.Fatal(err)
	}
	cc.Close()
	ca, _ := dial(t, env, ana[0])
	mustSend(t, ca, "g", "c1", []byte("x"))
	s.waitFor(t, ben[0].ID, 1)
	s.exactly(t, cat[0].ID, 0, 300*time.Millisecond)
}

// TestNotifyOffWithoutProvider: a server with no provider configured
// refuses registrations and queues nothing for messages, recalls or
// reads: push notifications cost it nothing per send.
func TestNotifyOffWithoutProvider(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	env := parleytest.Start(t, cfg)
	ana := env.User(t, "ana", 1)
	ben := env.User(t, "ben", 1)
	env.Group(t, "g", "ana", "ben")
	ca, _ := dial(t, env, ana[0])
	cb, _ := dial(t, env, ben[0])
	if _, err := cb.Do(ctx(t), wire.Request{T: wire.TNotifyRegister, Provider: "webhook", Token: "x"}); wire.CodeOf(err) != wire.BadRequest {
		t.Fatalf("notify_register without a provider: %v, want BAD_REQUEST", err)
	}
	var last wire.Message
	for i := range 5 {
		last = mustSend(t, ca, "g", fmt.Sprintf("c%d", i), []byte("hello"))
	}
	if _, err := ca.Do(ctx(t), wire.Request{T: wire.TRecall, Conv: "g", Seq: last.Seq}); err != nil {
		t.Fatalf("recall: %v", err)
	}
	if _, err := cb.Do(ctx(t), wire.Request{T: wire.TRead, Conv: "g", Seq: last.Seq}); err != nil {
		t.Fatalf("read: %v", err)
	}
	rdb := parleytest.RedisClient(t, cfg)
	// Nothing is queued now, nor shortly after (the intake is asynchronous).
	for range 3 {
		for shard := range cfg.NotifyShards {
			tag := cfg.RedisPrefix + "notify:{n" + strconv.Itoa(shard) + "}:"
			for _, k := range []string{tag + "due", tag + "jobs"} {
				if n, err := rdb.Exists(ctx(t), k).Result(); err != nil || n != 0 {
					t.Fatalf("%s exists (%d, %v): a job was queued without a provider", k, n, err)
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestNotifyBadInput: every refused request is answered with its code and
// stores nothing.
func TestNotifyBadInput(t *testing.T) {
	t.Parallel()
	s := newSink(t)
	env := parleytest.Start(t, notifyConfig(t, s, 200*time.Millisecond))
	ana := env.User(t, "ana", 1)
	env.User(t, "ben", 0)
	env.Group(t, "g", "ana", "ben")
	env.Group(t, "other", "ben")
	ca, frames := dial(t, env, ana[0])
	for _, c := range []struct {
		name string
		req  wire.Request
		code wire.Code
	}{
		{"unknown provider", wire.Request{T: wire.TNotifyRegister, Provider: "pigeon", Token: "x"}, wire.BadRequest},
		{"empty token", wire.Request{T: wire.TNotifyRegister, Provider: "webhook", Token: "", Has: wire.FToken}, wire.BadRequest},
		{"token over 4 KiB", wire.Request{T: wire.TNotifyRegister, Provider: "webhook", Token: strings.Repeat("t", 4097)}, wire.BadRequest},
		{"provider without credentials", wire.Request{T: wire.TNotifyRegister, Provider: "apns", Token: "x"}, wire.BadRequest},
		{"conv_settings on a never-joined conversation", wire.Request{T: wire.TConvSettings, Conv: "other", MutedUntil: 1}, wire.NotMember},
		{"conv_settings on no conversation", wire.Request{T: wire.TConvSettings, Conv: "nope", MutedUntil: 1}, wire.NotMember},
		{"mentions over 50", wire.Request{T: wire.TSend, Conv: "g", Cmid: "m51", Body: []byte("x"), Mentions: make([]string, 51)}, wire.BadRequest},
	} {
		if _, err := ca.Do(ctx(t), c.req); wire.CodeOf(err) != c.code {
			t.Errorf("%s: %v, want %s", c.name, err, c.code)
		}
	}
	// mentions that is not a list of strings
	for i, bad := range []any{"ben", []any{"ben", 7}, map[string]any{"a": 1}} {
		rid := fmt.Sprint("raw", i)
		if err := ca.Write(map[string]any{"t": "send", "rid": rid, "conv": "g", "cmid": "bad", "body": []byte("x"), "mentions": bad}); err != nil {
			t.Fatal(err)
		}
		for m := range frames {
			if m.Rid == rid {
				if m.T != wire.TError || m.Code != wire.BadRequest {
					t.Errorf("mentions %v: %+v, want BAD_REQUEST", bad, m)
				}
				break
			}
		}
	}
	var dev struct {
		Notify any `json:"notify"`
	}
	if st := env.Admin(t, "GET", "/v1/devices/"+ana[0].ID, nil, &dev); st != 200 || dev.Notify != nil {
		t.Fatalf("a refused registration was stored: %d %+v", st, dev.Notify)
	}
	page, err := ca.Sync(ctx(t), "g", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range page.Events {
		if e.Kind == "msg" {
			t.Fatalf("a refused send was stored: %+v", e)
		}
	}
	convs, err := ca.Convs(ctx(t), 10, "")
	if err != nil || len(convs.Items) != 1 || convs.Items[0].MutedUntil != 0 {
		t.Fatalf("convs: %+v %v", convs, err)
	}
}

// TestNotifySurvivesKill: a parleyd killed (SIGKILL) after a message was
// confirmed and before its notify_delay passed loses nothing: the next
// parleyd on the same stores notifies the device, once.
func TestNotifySurvivesKill(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	s := newSink(t)
	cfg := notifyConfig(t, s, 1500*time.Millisecond)
	cfg.NotifyTimeout, cfg.NotifyLease = time.Second, 2*time.Second
	p := parleytest.StartProcess(t, cfg)
	env := &parleytest.Env{Addr: p.Addr, AdminURL: p.AdminURL}
	ana := env.User(t, "ana", 1)
	ben := env.User(t, "ben", 1)
	env.Group(t, "g", "ana", "ben")
	registeredOffline(t, env, ben[0])
	ca, _ := dial(t, env, ana[0])
	m := mustSend(t, ca, "g", "c1", []byte("x"))
	time.Sleep(200 * time.Millisecond) // confirmed and queued; notify_delay not over
	p.Kill()
	if got := s.received(); len(got) != 0 {
		t.Fatalf("notified before notify_delay: %+v", got)
	}
	p2 := parleytest.StartProcess(t, cfg)
	defer p2.Kill()
	got := s.waitFor(t, ben[0].ID, 1)
	if got[0].Seq != m.Seq {
		t.Fatalf("got %+v, want seq %d", got, m.Seq)
	}
	s.exactly(t, ben[0].ID, 1, 2500*time.Millisecond) // more than a lease: nothing more may come
}

// TestNotifyReinstallDeletesRegistration: reinstalling a device deletes
// its registration (GET /v1/devices/{id} shows notify: null) and its
// messages are no longer notified; notify_unregister does the same.
func TestNotifyReinstallDeletesRegistration(t *testing.T) {
	t.Parallel()
	s := newSink(t)
	env := parleytest.Start(t, notifyConfig(t, s, 200*time.Millisecond))
	ben := env.User(t, "ben", 2)
	type device struct {
		ID           string `json:"id"`
		User         string `json:"user"`
		InstallEpoch int64  `json:"install_epoch"`
		Connected    bool   `json:"connected"`
		Notify       *struct {
			Provider     string `json:"provider"`
			RegisteredAt int64  `json:"registered_at"`
		} `json:"notify"`
	}
	c1, _ := dial(t, env, ben[0])
	before := time.Now().UnixMilli()
	register(t, c1, "webhook", "t1")
	var d device
	if st := env.Admin(t, "GET", "/v1/devices/"+ben[0].ID, nil, &d); st != 200 || d.ID != ben[0].ID || d.User != "ben" || !d.Connected ||
		d.Notify == nil || d.Notify.Provider != "webhook" || d.Notify.RegisteredAt < before {
		t.Fatalf("device: %d %+v", st, d)
	}
	if st := env.Admin(t, "POST", "/v1/devices/"+ben[0].ID+"/reinstall", nil, nil); st != 200 {
		t.Fatalf("reinstall: %d", st)
	}
	d = device{}
	if env.Admin(t, "GET", "/v1/devices/"+ben[0].ID, nil, &d); d.Notify != nil || d.InstallEpoch != 1 {
		t.Fatalf("after reinstall: %+v", d)
	}
	c2, _ := dial(t, env, ben[1])
	register(t, c2, "webhook", "t2")
	if _, err := c2.Do(ctx(t), wire.Request{T: wire.TNotifyUnregister}); err != nil {
		t.Fatal(err)
	}
	d = device{}
	if env.Admin(t, "GET", "/v1/devices/"+ben[1].ID, nil, &d); d.Notify != nil {
		t.Fatalf("after unregister: %+v", d)
	}
	// The server learns of a client's close when its gateway reads it.
	c2.Close()
	testenv.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		d = device{}
		if env.Admin(t, "GET", "/v1/devices/"+ben[1].ID, nil, &d); d.Notify != nil || d.Connected {
			return fmt.Errorf("after unregister and close: %+v", d)
		}
		return nil
	})
	if st := env.Admin(t, "GET", "/v1/devices/nope", nil, nil); st != 404 {
		t.Fatalf("unknown device: %d", st)
	}
}
