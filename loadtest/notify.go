package loadtest

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/wire"
)

// NotifyReport is the notify scenario's result: what the webhook sink
// inside the tool received against the exact set of notifications the
// confirmed sends were owed.
type NotifyReport struct {
	Groups    int `json:"groups"`
	Size      int `json:"receivers_per_group"`
	Receivers int `json:"receivers"`
	Muted     int `json:"muted_receivers"`  // mute every group: owed nothing
	Acking    int `json:"acking_receivers"` // connected and acking: owed nothing
	Senders   int `json:"senders"`

	Expected   int64 `json:"expected"`   // notifications owed: confirmed sends × offline, unmuted receivers of their group
	Received   int64 `json:"received"`   // distinct expected notifications the sink got
	Missing    int64 `json:"missing"`    // owed, never received
	Duplicates int64 `json:"duplicates"` // requests beyond the first with one idempotency key
	Unexpected int64 `json:"unexpected"` // to a muted or acking device, or of no confirmed send
	// UnexpectedSample: idempotency keys (device:conv:seq) of some of them.
	UnexpectedSample []string `json:"unexpected_sample,omitempty"`
	BadSig           int64    `json:"bad_signature"`
	Collapsed        int64    `json:"collapsed"` // notifications with count > 1 (messages closer than notify_delay)
	PerS             float64  `json:"notifications_per_s"`
	// LatencyMs is commit → the sink (the payload's ts to its arrival).
	LatencyMs Summary `json:"commit_to_sink_ms"`
}

// notifySink is the webhook receiver: it checks signatures, counts
// requests by idempotency key and records commit → arrival.
type notifySink struct {
	secret []byte
	clk    clock
	lat    *Hist

	mu     sync.Mutex
	keys   map[string]int
	first  int64 // unix nanos of the first and last requests
	last   int64
	badSig atomic.Int64
	counts atomic.Int64 // notifications with count > 1
	n      atomic.Int64
}

func (s *notifySink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	now := s.clk.now()
	if len(s.secret) > 0 {
		m := hmac.New(sha256.New, s.secret)
		m.Write([]byte(r.Header.Get("Parley-Timestamp") + "."))
		m.Write(body)
		if !hmac.Equal([]byte("sha256="+hex.EncodeToString(m.Sum(nil))), []byte(r.Header.Get("Parley-Signature"))) {
			s.badSig.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
	}
	var p struct {
		Ts    int64 `json:"ts"`
		Count int64 `json:"count"`
	}
	_ = json.Unmarshal(body, &p)
	s.lat.Record(int(s.n.Add(1)), now-p.Ts*int64(time.Millisecond))
	if p.Count > 1 {
		s.counts.Add(1)
	}
	key := r.Header.Get("Parley-Idempotency-Key")
	s.mu.Lock()
	s.keys[key]++
	if s.first == 0 {
		s.first = now
	}
	s.last = now
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// runNotify is scenario notify: Groups groups, each of one sender device
// (Senders of them, each in many groups) and Size receivers drawn from
// Users receiver users, one device each, registered with the webhook and
// offline; every 20th receiver mutes its groups and another every 20th
// stays connected and acks what it is pushed: those are owed nothing.
// Sends go round-robin over the groups, so each group gets one message
// every Groups / Rate seconds, which must exceed notify_delay for each
// message to make a notification of its own. The server must post to
// NotifySink (its notify_webhook_url) with NotifySecret.
func runNotify(ctx context.Context, r *runner) error {
	if err := r.checkFDs(); err != nil {
		return err
	}
	cfg := r.cfg
	if gap := time.Duration(float64(cfg.Groups) / cfg.Rate * float64(time.Second)); gap < cfg.NotifyDelay+500*time.Millisecond {
		r.note("each group gets a message every %s, under notify_delay + 500ms (%s): notifications collapse and count as missing", gap, cfg.NotifyDelay+500*time.Millisecond)
	}
	sink, closeSink, err := r.startSink()
	if err != nil {
		return err
	}
	defer closeSink()

	t0 := time.Now()
	senders := make([]Device, cfg.Senders)
	recv := make([]Device, cfg.Users)
	var users []string
	for i := range senders {
		u := cfg.Prefix + "s" + strconv.Itoa(i)
		users = append(users, u)
		senders[i] = Device{ID: cfg.Prefix + "sd" + strconv.Itoa(i), User: u}
	}
	for i := range recv {
		u := cfg.Prefix + "r" + strconv.Itoa(i)
		users = append(users, u)
		recv[i] = Device{ID: cfg.Prefix + "rd" + strconv.Itoa(i), User: u}
	}
	if err := r.admin.Users(ctx, users); err != nil {
		return fmt.Errorf("provisioning users: %w", err)
	}
	all, err := r.admin.Devices(ctx, append(append([]Device{}, senders...), recv...))
	if err != nil {
		return fmt.Errorf("provisioning devices: %w", err)
	}
	senders, recv = all[:cfg.Senders], all[cfg.Senders:]
	members := func(g int) []int { // receiver indices of group g
		out := make([]int, cfg.Size)
		for j := range out {
			out[j] = (g*cfg.Size + j) % cfg.Users
		}
		return out
	}
	muted := func(i int) bool { return i%20 == 1 }
	acking := func(i int) bool { return i%20 == 2 }
	specs := make([]ConvSpec, cfg.Groups)
	for g := range specs {
		ms := []string{senders[g%cfg.Senders].User}
		for _, i := range members(g) {
			ms = append(ms, recv[i].User)
		}
		specs[g] = ConvSpec{Kind: "group", Members: ms}
	}
	convs, err := r.admin.Conversations(ctx, specs)
	if err != nil {
		return fmt.Errorf("provisioning conversations: %w", err)
	}
	groupsOf := make([][]int, cfg.Users)
	for g := range convs {
		for _, i := range members(g) {
			groupsOf[i] = append(groupsOf[i], g)
		}
	}
	fmt.Fprintf(cfg.Out, "provisioned %d senders, %d receivers, %d groups of %d receivers in %s (prefix %s)\n",
		cfg.Senders, cfg.Users, cfg.Groups, cfg.Size, time.Since(t0).Round(time.Millisecond), cfg.Prefix)

	// Register every receiver (muting where it should), then disconnect
	// the offline ones.
	t0 = time.Now()
	if err := r.registerReceivers(ctx, recv, func(i int) []string {
		if !muted(i) {
			return nil
		}
		var cs []string
		for _, g := range groupsOf[i] {
			cs = append(cs, convs[g].ID)
		}
		return cs
	}); err != nil {
		return err
	}
	fmt.Fprintf(cfg.Out, "registered %d receivers in %s\n", cfg.Users, time.Since(t0).Round(time.Millisecond))

	// Connect the senders and the acking receivers; the tracker expects
	// pushes to the acking ones.
	var online []Device
	var onlineRecv []int
	online = append(online, senders...)
	for i := range recv {
		if acking(i) {
			online = append(online, recv[i])
			onlineRecv = append(onlineRecv, i)
		}
	}
	tracks := make([]*convTrack, len(convs))
	for g, c := range convs {
		devs := []string{senders[g%cfg.Senders].ID}
		for _, i := range members(g) {
			if acking(i) {
				devs = append(devs, recv[i].ID)
			}
		}
		tracks[g] = r.tracker.Track(c.ID, c.Head, devs...)
	}
	conns, err := r.connectAll(ctx, online, func(k int) []*convTrack {
		if k < cfg.Senders {
			var ts []*convTrack
			for g := k; g < len(convs); g += cfg.Senders {
				ts = append(ts, tracks[g])
			}
			return ts
		}
		var ts []*convTrack
		for _, g := range groupsOf[onlineRecv[k-cfg.Senders]] {
			ts = append(ts, tracks[g])
		}
		return ts
	})
	if err != nil {
		return err
	}
	r.report.Connections = len(conns)
	r.report.Groups, r.report.GroupSize = cfg.Groups, cfg.Size+1
	r.load(ctx, func(k, intended int64) {
		g := int(k % int64(cfg.Groups))
		conns[g%cfg.Senders].send(convs[g].ID, k, intended)
	})

	// The acking receivers go on acking after the load. A test's
	// notifyAcked (it holds the server's notifications) runs meanwhile,
	// with the newest confirmed seq of each acking receiver's groups.
	var settled chan error
	if cfg.notifyAcked != nil {
		var owed []ackOwed
		for g, c := range convs {
			var newest int64
			tracks[g].mu.Lock()
			tracks[g].sent.eachNotIn(func(seq int64) { newest = max(newest, seq) })
			tracks[g].mu.Unlock()
			for _, i := range members(g) {
				if acking(i) && newest > 0 {
					owed = append(owed, ackOwed{Device: recv[i].ID, Conv: c.ID, Seq: newest})
				}
			}
		}
		settled = make(chan error, 1)
		go func() { settled <- cfg.notifyAcked(ctx, owed) }()
	}
	r.keepAcking(conns[cfg.Senders:])
	if settled != nil {
		if err := <-settled; err != nil {
			return fmt.Errorf("acks of the acking receivers: %w", err)
		}
	}
	// The notifications owed: each confirmed send, to each offline,
	// unmuted receiver of its group.
	want := map[string]bool{}
	for g, c := range convs {
		var to []string
		for _, i := range members(g) {
			if !muted(i) && !acking(i) {
				to = append(to, recv[i].ID)
			}
		}
		tracks[g].mu.Lock()
		tracks[g].sent.eachNotIn(func(seq int64) {
			for _, d := range to {
				want[d+":"+c.ID+":"+strconv.FormatInt(seq, 10)] = true
			}
		})
		tracks[g].mu.Unlock()
	}
	// Wait for them: notify_delay, then the server's backlog.
	deadline := time.Now().Add(cfg.NotifyDelay + 30*time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		sink.mu.Lock()
		got := 0
		for k := range want {
			if sink.keys[k] > 0 {
				got++
			}
		}
		sink.mu.Unlock()
		if got == len(want) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(cfg.NotifyDelay) // late duplicates and strays
	nr := &NotifyReport{Groups: cfg.Groups, Size: cfg.Size, Receivers: cfg.Users, Senders: cfg.Senders,
		Expected: int64(len(want)), BadSig: sink.badSig.Load(), Collapsed: sink.counts.Load()}
	for i := range recv {
		if muted(i) {
			nr.Muted++
		}
		if acking(i) {
			nr.Acking++
		}
	}
	sink.mu.Lock()
	for k, n := range sink.keys {
		if want[k] {
			nr.Received++
		} else {
			nr.Unexpected++
			if len(nr.UnexpectedSample) < 10 {
				nr.UnexpectedSample = append(nr.UnexpectedSample, k)
			}
		}
		nr.Duplicates += int64(n - 1)
	}
	if sink.last > sink.first {
		nr.PerS = round3(float64(sink.n.Load()) / (float64(sink.last-sink.first) / 1e9))
	}
	sink.mu.Unlock()
	nr.Missing = nr.Expected - nr.Received
	nr.LatencyMs = Summarize(sink.lat.Total())
	r.report.Notify = nr
	return nil
}

// ackOwed is an ack an acking receiver owes: Device holds Conv up to Seq.
type ackOwed struct {
	Device, Conv string
	Seq          int64
}

// keepAcking has conns go on acking what they hold for half of
// notify_delay after the load (the load's acks stop with it), as a
// connected device keeps doing: pushes of the last commits may still be
// arriving, and one acked only after notify_delay is notified.
func (r *runner) keepAcking(conns []*Conn) {
	if r.cfg.AckDelay <= 0 {
		return
	}
	r.acking.Store(true)
	end := time.Now().Add(max(r.cfg.NotifyDelay/2, 100*time.Millisecond))
	for {
		for _, c := range conns {
			c.flushAcks()
		}
		if !time.Now().Before(end) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.acking.Store(false)
}

// startSink starts the webhook sink on cfg.NotifySink; the func stops it.
func (r *runner) startSink() (*notifySink, func(), error) {
	sink := &notifySink{secret: []byte(r.cfg.NotifySecret), clk: r.clk, lat: NewHist(), keys: map[string]int{}}
	ln, err := net.Listen("tcp", r.cfg.NotifySink)
	if err != nil {
		return nil, nil, fmt.Errorf("notify sink: %w", err)
	}
	srv := &http.Server{Handler: sink, ReadHeaderTimeout: 10 * time.Second}
	r.goroutine(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.note("notify sink: %v", err)
		}
	})
	return sink, func() { _ = srv.Close() }, nil
}

// report is what the sink received, without an exact owed set
// (direct -phones, where collapsing decides which seqs are notified):
// notifications whose idempotency key (device:conv:seq) expected refuses
// count as unexpected.
func (s *notifySink) report(expected func(key string) bool) *NotifyReport {
	nr := &NotifyReport{BadSig: s.badSig.Load(), Collapsed: s.counts.Load()}
	s.mu.Lock()
	for k, n := range s.keys {
		nr.Received++
		nr.Duplicates += int64(n - 1)
		if !expected(k) {
			nr.Unexpected++
			if len(nr.UnexpectedSample) < 10 {
				nr.UnexpectedSample = append(nr.UnexpectedSample, k)
			}
		}
	}
	if s.last > s.first {
		nr.PerS = round3(float64(s.n.Load()) / (float64(s.last-s.first) / 1e9))
	}
	s.mu.Unlock()
	nr.LatencyMs = Summarize(s.lat.Total())
	return nr
}

// registerReceivers connects each receiver once, registers its webhook
// token, mutes the conversations mute(i) names, and disconnects.
func (r *runner) registerReceivers(ctx context.Context, devs []Device, mute func(i int) []string) error {
	const workers = 32
	next := atomic.Int64{}
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(devs) {
					return
				}
				if err := r.registerOne(ctx, devs[i], mute(i)); err != nil {
					errs <- fmt.Errorf("registering %s: %w", devs[i].ID, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (r *runner) registerOne(ctx context.Context, d Device, mute []string) error {
	for attempt := 0; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := client.Dial(cctx, r.cfg.Addr, d.ID, d.Token, client.DialOptions{})
		if err != nil {
			cancel()
			if e, ok := wire.AsError(err); ok && e.Code == wire.RateLimited && attempt < 20 {
				time.Sleep(time.Duration(max(e.RetryAfterMs, 10)) * time.Millisecond)
				continue
			}
			return err
		}
		_, err = c.Do(cctx, wire.Request{T: wire.TNotifyRegister, Provider: wire.ProviderWebhook, Token: "lt-" + d.ID})
		for _, conv := range mute {
			if err == nil {
				_, err = c.Do(cctx, wire.Request{T: wire.TConvSettings, Conv: conv, MutedUntil: time.Now().Add(24 * time.Hour).UnixMilli()})
			}
		}
		c.Close()
		cancel()
		return err
	}
}
