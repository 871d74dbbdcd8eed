package notify

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/scripts"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/test/testenv"
)

// keySink counts webhook requests by idempotency key.
type keySink struct {
	srv  *httptest.Server
	mu   sync.Mutex
	keys map[string]int
}

func newKeySink(t *testing.T) *keySink {
	s := &keySink{keys: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		s.keys[r.Header.Get(HeaderIdempotency)]++
		s.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *keySink) count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keys[key]
}

// world is a store with users ana and ben (device ben-d), conversation g
// of both, and ben-d registered with the webhook.
type world struct {
	st     *store.Store
	rdb    redis.UniversalClient
	prefix string
}

func newWorld(t *testing.T, provider string) *world {
	ctx := context.Background()
	st, err := store.Open(ctx, testenv.PostgresURL(t), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	rdb, prefix := testenv.RedisClient(t)
	if err := scripts.Load(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateUsers(ctx, []string{"ana", "ben"}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateDevices(ctx, []store.Device{{ID: "ben-d", User: "ben", TokenSHA256: make([]byte, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateConversation(ctx, store.MembershipChange{Conv: "g", Seq: 1, Ts: time.Now().UnixMilli()}, "group", "", []string{"ana", "ben"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RegisterNotify(ctx, store.Registration{Device: "ben-d", User: "ben", Provider: provider, Token: "tok", RegisteredAt: 1}); err != nil {
		t.Fatal(err)
	}
	return &world{st: st, rdb: rdb, prefix: prefix}
}

// send commits a message of ana in g at seq and returns it as committed.
func (w *world) send(t *testing.T, seq int64) eventlog.Committed {
	ts := time.Now().UnixMilli()
	res, err := w.st.InsertMessages(context.Background(), []store.NewMessage{{Conv: "g", Sender: "ana", Cmid: fmt.Sprint("c", seq), Body: []byte("x"), Seq: seq, Ts: ts}}, 200)
	if err != nil || res[0].Err != nil {
		t.Fatalf("insert: %v %v", err, res)
	}
	return eventlog.Committed{Event: store.Event{Conv: "g", Seq: seq, Kind: store.KindMsg, Sender: "ana", Ts: ts}, Members: 2}
}

func (w *world) notifier(t *testing.T, reg prometheus.Registerer, providers ...Provider) *Notifier {
	n := New(w.st, w.rdb, Config{Delay: 100 * time.Millisecond, TTL: time.Hour, BadgeMax: 999, Shards: 2, Lease: time.Second,
		Timeout: 500 * time.Millisecond, Concurrency: 2, WriteFanoutMax: 200, OnlineFanoutMax: 2000, Prefix: w.prefix},
		providers, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	t.Cleanup(n.Close)
	return n
}

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestWorkerKilledAfterSending: a worker that dies after the provider
// accepted a notification, before recording it, leaves the job to be
// claimed again when its lease ends: the notification is delivered once
// more (same idempotency key), counted as a duplicate, and not again.
func TestWorkerKilledAfterSending(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "webhook")
	sink := newKeySink(t)
	a := w.notifier(t, nil, NewWebhook(sink.srv.URL, "s", sink.srv.Client()))
	died := make(chan struct{})
	var once sync.Once
	a.beforeFinish = func(*job, error) bool {
		once.Do(func() { close(died) })
		return false // the worker dies here
	}
	a.Start()
	a.Committed([]eventlog.Committed{w.send(t, 2)})
	select {
	case <-died:
	case <-time.After(10 * time.Second):
		t.Fatal("the notification was not sent")
	}
	a.Close()
	if n := sink.count("ben-d:g:2"); n != 1 {
		t.Fatalf("delivered %d times before the worker died, want 1", n)
	}
	reg := prometheus.NewRegistry()
	b := w.notifier(t, reg, NewWebhook(sink.srv.URL, "s", sink.srv.Client()))
	b.Start()
	testenv.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := sink.count("ben-d:g:2"); n != 2 {
			return fmt.Errorf("delivered %d times", n)
		}
		return nil
	})
	time.Sleep(1500 * time.Millisecond) // more than a lease: nothing more may come
	if n := sink.count("ben-d:g:2"); n != 2 {
		t.Fatalf("delivered %d times, want 2 (once more at most)", n)
	}
	if d := counter(t, reg, "parley_notify_duplicated_total"); d != 1 {
		t.Fatalf("duplicated %v, want 1", d)
	}
}

// dropping is a provider that takes notifications and never delivers
// them (its worker dies before the request).
type dropping struct{}

func (dropping) Name() string                              { return "webhook" }
func (dropping) Send(context.Context, *Notification) error { return nil }

// TestWorkerKilledBeforeSending: a worker that dies holding a claimed
// job, before any request, loses nothing: another delivers it once the
// lease ends.
func TestWorkerKilledBeforeSending(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "webhook")
	sink := newKeySink(t)
	a := w.notifier(t, nil, dropping{})
	died := make(chan struct{})
	var once sync.Once
	a.beforeFinish = func(*job, error) bool {
		once.Do(func() { close(died) })
		return false
	}
	a.Start()
	a.Committed([]eventlog.Committed{w.send(t, 2)})
	select {
	case <-died:
	case <-time.After(10 * time.Second):
		t.Fatal("the job was not taken")
	}
	a.Close()
	b := w.notifier(t, nil, NewWebhook(sink.srv.URL, "s", sink.srv.Client()))
	b.Start()
	testenv.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := sink.count("ben-d:g:2"); n != 1 {
			return fmt.Errorf("delivered %d times", n)
		}
		return nil
	})
}

// hanging is a provider whose requests never finish before their timeout.
type hanging struct{ name string }

func (h hanging) Name() string { return h.name }
func (h hanging) Send(ctx context.Context, _ *Notification) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestHangingProviderBlocksNothing: a provider that never answers holds
// only its own workers: the intake never blocks, and another provider's
// notifications go out on time.
func TestHangingProviderBlocksNothing(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "apns")
	ctx := context.Background()
	if err := w.st.CreateUsers(ctx, []string{"cat"}); err != nil {
		t.Fatal(err)
	}
	if err := w.st.CreateDevices(ctx, []store.Device{{ID: "cat-d", User: "cat", TokenSHA256: make([]byte, 32)}}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := w.st.AddMembers(ctx, &store.MembershipChange{Conv: "g", Seq: 2, Ts: time.Now().UnixMilli()}, []string{"cat"}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.st.RegisterNotify(ctx, store.Registration{Device: "cat-d", User: "cat", Provider: "webhook", Token: "t", RegisteredAt: 1}); err != nil {
		t.Fatal(err)
	}
	sink := newKeySink(t)
	n := w.notifier(t, nil, hanging{"apns"}, NewWebhook(sink.srv.URL, "s", sink.srv.Client()))
	n.Start()
	for seq := int64(3); seq < 23; seq++ {
		start := time.Now()
		n.Committed([]eventlog.Committed{w.send(t, seq)})
		if d := time.Since(start); d > 250*time.Millisecond { // it only queues; the margin is for a loaded machine
			t.Fatalf("Committed blocked for %v", d)
		}
		// One notification per notify_delay per (device, conversation):
		// wait for cat's before the next message.
		testenv.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			if sink.count(fmt.Sprintf("cat-d:g:%d", seq)) != 1 {
				return fmt.Errorf("cat not notified of %d", seq)
			}
			return nil
		})
		if d := time.Since(start); d > 3*time.Second { // notify_delay 100ms; blocked, it would wait for ever
			t.Fatalf("cat notified %v after the commit while apns hangs", d)
		}
	}
}

// slowSink is a provider taking a while for each request; it counts
// requests by idempotency key.
type slowSink struct {
	name string
	wait time.Duration
	mu   sync.Mutex
	keys map[string]int
}

func (s *slowSink) Name() string { return s.name }
func (s *slowSink) Send(ctx context.Context, n *Notification) error {
	time.Sleep(s.wait)
	s.mu.Lock()
	s.keys[n.Key]++
	s.mu.Unlock()
	return nil
}

// addRegistered adds users a00… (devices a00-d…) to g at seq 2, each
// device registered with provider.
func (w *world) addRegistered(t *testing.T, n int, provider string) []string {
	ctx := context.Background()
	users := make([]string, n)
	devices := make([]store.Device, n)
	for i := range users {
		users[i] = fmt.Sprintf("a%02d", i)
		devices[i] = store.Device{ID: users[i] + "-d", User: users[i], TokenSHA256: make([]byte, 32)}
	}
	if err := w.st.CreateUsers(ctx, users); err != nil {
		t.Fatal(err)
	}
	if err := w.st.CreateDevices(ctx, devices); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := w.st.AddMembers(ctx, &store.MembershipChange{Conv: "g", Seq: 2, Ts: time.Now().UnixMilli()}, users); err != nil {
		t.Fatal(err)
	}
	for _, d := range devices {
		if _, err := w.st.RegisterNotify(ctx, store.Registration{Device: d.ID, User: d.User, Provider: provider, Token: "t", RegisteredAt: 1}); err != nil {
			t.Fatal(err)
		}
	}
	return users
}

// TestBusyProviderKeepsPace: more notifications at once than a
// provider's queue holds are handed over as its workers free up, not put
// back to be claimed again.
func TestBusyProviderKeepsPace(t *testing.T) { // not parallel: it measures the pace of one notifier
	w := newWorld(t, "fcm")
	users := w.addRegistered(t, 40, "fcm") // the queue holds 16 (Concurrency 2)
	slow := &slowSink{name: "fcm", wait: 10 * time.Millisecond, keys: map[string]int{}}
	reg := prometheus.NewRegistry()
	n := w.notifier(t, reg, slow)
	n.Start()
	c := w.send(t, 3)
	c.Members = 42
	n.Committed([]eventlog.Committed{c})
	testenv.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		slow.mu.Lock()
		defer slow.mu.Unlock()
		for _, u := range append(users, "ben") {
			if k := u + "-d:g:3"; slow.keys[k] != 1 {
				return fmt.Errorf("%s sent %d times", k, slow.keys[k])
			}
		}
		return nil
	})
	if d := counter(t, reg, "parley_notify_deferred_total"); d != 0 {
		t.Fatalf("%v notifications deferred, want 0: the queue frees up within the wait", d)
	}
}

// TestHangingProviderQueueFull: a provider that never answers and whose
// queue is full delays another provider's notification by the dispatch
// wait (250 ms) at most; its own jobs are put back and counted, and they
// are not lost.
func TestHangingProviderQueueFull(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "apns") // ben-d
	ctx := context.Background()
	users := w.addRegistered(t, 40, "apns")
	if err := w.st.CreateUsers(ctx, []string{"cat"}); err != nil {
		t.Fatal(err)
	}
	if err := w.st.CreateDevices(ctx, []store.Device{{ID: "cat-d", User: "cat", TokenSHA256: make([]byte, 32)}}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := w.st.AddMembers(ctx, &store.MembershipChange{Conv: "g", Seq: 3, Ts: time.Now().UnixMilli()}, []string{"cat"}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.st.RegisterNotify(ctx, store.Registration{Device: "cat-d", User: "cat", Provider: "webhook", Token: "t", RegisteredAt: 1}); err != nil {
		t.Fatal(err)
	}
	sink := newKeySink(t)
	reg := prometheus.NewRegistry()
	n := w.notifier(t, reg, hanging{"apns"}, NewWebhook(sink.srv.URL, "s", sink.srv.Client()))
	n.Start()
	c := w.send(t, 4)
	c.Members = 43
	start := time.Now()
	n.Committed([]eventlog.Committed{c})
	testenv.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if sink.count("cat-d:g:4") != 1 {
			return fmt.Errorf("cat not notified")
		}
		return nil
	})
	// notify_delay 100 ms, the merge window 10 ms, the wait 250 ms; the
	// rest is margin for a loaded machine.
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Fatalf("cat notified %v after the commit while apns hangs with a full queue", d)
	}
	testenv.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if d := counter(t, reg, "parley_notify_deferred_total"); d == 0 {
			return fmt.Errorf("nothing deferred while 41 apns jobs met a queue of 16")
		}
		return nil
	})
	// The deferred jobs are still queued (with those in flight).
	if b, err := n.q.backlog(ctx); err != nil || b < int64(len(users)+1-2*8-2) {
		t.Fatalf("backlog %d (%v), want the deferred apns jobs kept", b, err)
	}
}

// TestIdleShardsSleep: with nothing queued, a shard is looked at about
// once a second, not every Poll (20 ms); a job this process queues wakes
// its shard, which sleeps until the job is due, and the notification goes
// out once.
func TestIdleShardsSleep(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "webhook")
	sink := newKeySink(t)
	reg := prometheus.NewRegistry()
	n := w.notifier(t, reg, NewWebhook(sink.srv.URL, "s", sink.srv.Client()))
	n.Start()
	time.Sleep(1500 * time.Millisecond)
	// 2 shards: a look at the start and one a second after (polling
	// every 20 ms would have been 150).
	if c := counter(t, reg, "parley_notify_claims_total"); c < 2 || c > 8 {
		t.Fatalf("%v looks at 2 idle shards in 1.5 s, want 2 to 8", c)
	}
	n.Committed([]eventlog.Committed{w.send(t, 2)})
	testenv.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if c := sink.count("ben-d:g:2"); c != 1 {
			return fmt.Errorf("delivered %d times", c)
		}
		return nil
	})
}

// TestLaterJobsLetShardSleep: jobs queued for later than a shard's next
// look do not wake its loop (each wake is a claim, a script call).
func TestLaterJobsLetShardSleep(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "webhook")
	sink := newKeySink(t)
	reg := prometheus.NewRegistry()
	n := w.notifier(t, reg, NewWebhook(sink.srv.URL, "s", sink.srv.Client()))
	n.Start()
	time.Sleep(200 * time.Millisecond) // each shard's first look; the next in a second
	before := counter(t, reg, "parley_notify_claims_total")
	ctx := context.Background()
	for i := range 20 {
		due := time.Now().Add(5 * time.Second).UnixMilli()
		job := newJob{ID: fmt.Sprintf("b|u%d", i), Shard: 0, Due: due, Seq: due, Ts: due, Body: jobBody{User: fmt.Sprint("u", i)}}
		if err := n.q.enqueue(ctx, []newJob{job}, n.cfg.Delay); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// At most the two shards' idle looks and one more each (a loaded
	// machine may stretch the 200 ms); woken per job it was 20.
	if c := counter(t, reg, "parley_notify_claims_total") - before; c > 4 {
		t.Fatalf("%v claims while 20 jobs due in 5 s were queued over 200 ms, want 4 at most", c)
	}
}
