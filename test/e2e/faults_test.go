//go:build linux

package e2e_test

// Fault experiments: a steady load of group messages while a backend or a
// gateway fails, each ending with the count of confirmed messages lost,
// duplicated and delivered out of order, all of which must be 0: what was
// confirmed is never lost, a syncing client never skips an event, a
// resent message is stored once, and a dead gateway's routes stop being
// used. The load is a few senders (client.Conn with retries by the same
// cmid, which see every error code, and one client.Client) sending to one
// group at a modest rate, and online receivers (client.Client, the
// reference client) that must end with every confirmed message exactly
// once, in seq order. The PostgreSQL log is checked too: every confirmed
// (cmid, seq) is there.
//
// Not here:
//   - slow consumer: conn/gateway_test.go TestSlowConsumer.
//   - killing a fan-out worker: server/fanout_rows_test.go
//     TestFaultFanoutWorkerKilledMidFanout.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
	"github.com/parley-im/parley/wire"
)

const (
	faultConv       = "g"
	faultInterval   = 25 * time.Millisecond // per sender: ~40 messages/s
	faultMsgTimeout = 30 * time.Second      // one message's retries
)

// faultRun is one experiment's load and its bookkeeping.
type faultRun struct {
	t     *testing.T
	name  string
	pgURL string

	stop    chan struct{} // closed: senders finish their message and return
	senders sync.WaitGroup
	sent    atomic.Int64

	mu        sync.Mutex
	confirmed map[string]int64 // cmid -> seq
	confDup   int              // a cmid confirmed with two different seqs
	codes     map[wire.Code]int
	timeouts  int      // attempts that timed out (outcome unknown: retried)
	connErrs  int      // attempts that lost their connection (retried)
	failures  []string // sends given up, unexpected errors
	lastOK    time.Time
	slowest   time.Duration // the longest send attempt of a connSender

	receivers []*faultReceiver
}

// faultReceiver is an online client.Client and what it delivered.
type faultReceiver struct {
	name string
	c    *client.Client

	mu  sync.Mutex
	evs []wire.Event // every event of faultConv, in OnEvent order
}

func newFaultRun(t *testing.T, name, pgURL string) *faultRun {
	r := &faultRun{t: t, name: name, pgURL: pgURL, stop: make(chan struct{}),
		confirmed: map[string]int64{}, codes: map[wire.Code]int{}}
	// If the test fails early, stop the senders before the servers go.
	t.Cleanup(r.halt)
	return r
}

func (r *faultRun) halt() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	r.senders.Wait()
}

func (r *faultRun) confirm(cmid string, seq int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, ok := r.confirmed[cmid]; ok && prev != seq {
		r.confDup++
		r.failures = append(r.failures, fmt.Sprintf("cmid %s confirmed at seqs %d and %d", cmid, prev, seq))
	}
	r.confirmed[cmid] = seq
	r.lastOK = time.Now()
	r.sent.Add(1)
}

func (r *faultRun) fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.failures) < 20 {
		r.failures = append(r.failures, fmt.Sprintf(format, args...))
	}
}

// attemptErr records why one attempt (a dial or a send) failed. It reports
// whether the connection is gone (the sender must dial again).
func (r *faultRun) attemptErr(err error) (redial bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if we, ok := wire.AsError(err); ok {
		// Any code but UNAVAILABLE fails the experiment (checked at the end).
		r.codes[we.Code]++
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		r.timeouts++
		return false
	}
	r.connErrs++
	return true
}

// code is how many attempts got code so far.
func (r *faultRun) code(c wire.Code) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.codes[c]
}

// maxConfirmed is the highest confirmed seq so far.
func (r *faultRun) maxConfirmed() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var m int64
	for _, s := range r.confirmed {
		m = max(m, s)
	}
	return m
}

// lastConfirmed is when the last send was confirmed.
func (r *faultRun) lastConfirmed() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastOK
}

// connSender sends from dev over a client.Conn dialled at addr(), retrying
// every message with its cmid until it is confirmed, until stop.
func (r *faultRun) connSender(id string, addr func() string, dev parleytest.Device) {
	r.senders.Add(1)
	go func() {
		defer r.senders.Done()
		var c *client.Conn
		defer func() {
			if c != nil {
				c.Close()
			}
		}()
		for n := 0; ; n++ {
			select {
			case <-r.stop:
				return
			case <-time.After(faultInterval):
			}
			cmid := fmt.Sprintf("%s-%d", id, n)
			giveUp := time.Now().Add(faultMsgTimeout)
			for attempt := 0; ; attempt++ {
				if time.Now().After(giveUp) {
					r.fail("%s: %s not confirmed after %v", id, cmid, faultMsgTimeout)
					return
				}
				if attempt > 0 {
					// The sender's own backoff, part of the load.
					time.Sleep(min(20*time.Millisecond<<min(attempt, 4), 200*time.Millisecond))
				}
				if c == nil {
					dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					var err error
					c, err = client.Dial(dctx, addr(), dev.ID, dev.Token, client.DialOptions{})
					cancel()
					if err != nil {
						c = nil
						r.attemptErr(err)
						continue
					}
				}
				sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				t0 := time.Now()
				res, err := c.Send(sctx, faultConv, cmid, []byte(cmid))
				cancel()
				r.mu.Lock()
				r.slowest = max(r.slowest, time.Since(t0))
				r.mu.Unlock()
				if err == nil {
					r.confirm(cmid, res.Seq)
					break
				}
				if r.attemptErr(err) {
					c.Close()
					c = nil
				} else if code := wire.CodeOf(err); code != "" && code != wire.Unavailable && code != wire.RateLimited {
					r.fail("%s: %s refused: %v", id, cmid, err)
					return
				}
			}
		}
	}()
}

// clientSender sends through a client.Client (which retries by the same
// cmid by itself), until stop.
func (r *faultRun) clientSender(id string, c *client.Client) {
	r.senders.Add(1)
	go func() {
		defer r.senders.Done()
		for n := 0; ; n++ {
			select {
			case <-r.stop:
				return
			case <-time.After(faultInterval):
			}
			cmid := fmt.Sprintf("%s-%d", id, n)
			ctx, cancel := context.WithTimeout(context.Background(), faultMsgTimeout)
			res, err := c.Send(ctx, faultConv, cmid, []byte(cmid))
			cancel()
			if err != nil {
				r.fail("%s: %s: %v", id, cmid, err)
				return
			}
			r.confirm(cmid, res.Seq)
		}
	}()
}

// receiver starts an online client.Client for dev at addr, watching the
// group from its start, and waits until it is connected.
func (r *faultRun) receiver(name, addr string, dev parleytest.Device) *faultReceiver {
	r.t.Helper()
	fr := &faultReceiver{name: name}
	fr.c = client.New(client.Options{
		Addr: addr, Device: dev.ID, Token: dev.Token,
		RequestTimeout: 3 * time.Second,
		MaxBackoff:     2 * time.Second,
		AutoAck:        true,
		OnEvent: func(conv string, ev wire.Event) {
			if conv != faultConv {
				return
			}
			fr.mu.Lock()
			fr.evs = append(fr.evs, ev)
			fr.mu.Unlock()
		},
	})
	fr.c.Watch(faultConv, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := fr.c.Start(ctx); err != nil {
		r.t.Fatalf("%s: start: %v", name, err)
	}
	r.t.Cleanup(func() { fr.c.Close() })
	r.receivers = append(r.receivers, fr)
	return fr
}

// haveAll reports how many confirmed messages fr has delivered at their
// confirmed seq.
func (fr *faultReceiver) haveAll(confirmed map[string]int64) int {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	got := make(map[string]int64, len(fr.evs))
	for _, e := range fr.evs {
		if e.Kind == wire.KindMsg {
			got[e.Cmid] = e.Seq
		}
	}
	n := 0
	for cmid, seq := range confirmed {
		if s, ok := got[cmid]; ok && s == seq {
			n++
		}
	}
	return n
}

// warmUp waits until n messages are confirmed (bounded).
func (r *faultRun) warmUp(n int64) {
	r.t.Helper()
	testenv.CheckFor(r.t, 15*time.Second, 5*time.Millisecond, func() error {
		if r.sent.Load() < n {
			return fmt.Errorf("%s: only %d of %d messages confirmed before the fault", r.name, r.sent.Load(), n)
		}
		return nil
	})
}

// waitSendsOK waits until a send is confirmed after t0 and returns how long
// after t0 that was.
func (r *faultRun) waitSendsOK(t0 time.Time) time.Duration {
	r.t.Helper()
	var took time.Duration
	testenv.CheckFor(r.t, 20*time.Second, 5*time.Millisecond, func() error {
		if last := r.lastConfirmed(); last.After(t0) {
			took = last.Sub(t0)
			return nil
		}
		return fmt.Errorf("%s: no send confirmed since the fault ended", r.name)
	})
	return took
}

// finish stops the load, waits until every receiver has every confirmed
// message (bounded), counts what was lost, duplicated and reordered, logs
// one line and fails the test unless all three are 0. extra is appended to
// the line.
func (r *faultRun) finish(extra string) {
	t := r.t
	t.Helper()
	stopped := time.Now()
	done := make(chan struct{})
	go func() { r.halt(); close(done) }()
	select {
	case <-done:
	case <-time.After(faultMsgTimeout + 5*time.Second):
		t.Fatalf("%s: senders did not stop", r.name)
	}
	r.mu.Lock()
	confirmed := maps.Clone(r.confirmed)
	codes := fmt.Sprint(r.codes)
	failures := slices.Clone(r.failures)
	unexpected := 0
	for code, n := range r.codes {
		if code != wire.Unavailable {
			unexpected += n
		}
	}
	timeouts, connErrs, confDup, slowest := r.timeouts, r.connErrs, r.confDup, r.slowest
	r.mu.Unlock()

	// Receivers catch up through their own machinery (pushes, gap syncs,
	// hints, resync after reconnect): the test never asks them to sync.
	// This polls by hand, not with testenv.CheckFor: a receiver still
	// behind after 20 s must not stop the test, which goes on to count
	// what each one lost, duplicated and reordered.
	caughtUp := time.Duration(-1)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		all := true
		for _, fr := range r.receivers {
			if fr.haveAll(confirmed) != len(confirmed) {
				all = false
				break
			}
		}
		if all {
			caughtUp = time.Since(stopped)
			break
		}
		time.Sleep(20 * time.Millisecond) // the poll's interval
	}

	var lost, dup, reorder int
	dup += confDup
	for _, fr := range r.receivers {
		l, d, o := fr.count(confirmed)
		if l+d+o > 0 {
			t.Errorf("%s: receiver %s: lost=%d dup=%d reorder=%d (cursor %d, max confirmed seq %d)",
				r.name, fr.name, l, d, o, fr.c.Cursor(faultConv), faultMaxSeq(confirmed))
		}
		lost, dup, reorder = lost+l, dup+d, reorder+o
	}
	l, d, unconfirmed, holes := r.checkLog(confirmed)
	if l+d > 0 {
		t.Errorf("%s: PostgreSQL log: lost=%d dup=%d", r.name, l, d)
	}
	lost, dup = lost+l, dup+d

	caught := "never"
	if caughtUp >= 0 {
		caught = caughtUp.Round(time.Millisecond).String()
	}
	t.Logf("fault=%s lost=%d dup=%d reorder=%d confirmed=%d receivers=%d codes=%s timeouts=%d conn_errors=%d unconfirmed_in_log=%d holes=%d slowest_attempt=%v caught_up=%s%s",
		r.name, lost, dup, reorder, len(confirmed), len(r.receivers), codes, timeouts, connErrs, unconfirmed, holes,
		slowest.Round(time.Millisecond), caught, extra)
	for _, f := range failures {
		t.Errorf("%s: %s", r.name, f)
	}
	if unexpected > 0 {
		t.Errorf("%s: senders got error codes other than UNAVAILABLE: %s", r.name, codes)
	}
	if lost+dup+reorder > 0 {
		t.Errorf("%s: lost=%d dup=%d reorder=%d, want all 0", r.name, lost, dup, reorder)
	}
	if caughtUp < 0 {
		t.Errorf("%s: receivers did not catch up within 20 s of the end of the load", r.name)
	}
	if len(confirmed) == 0 {
		t.Errorf("%s: nothing confirmed", r.name)
	}
}

// count compares what fr delivered with the confirmed messages: lost
// (a confirmed message missing, or at another seq), dup (a seq or cmid
// delivered twice), reorder (a seq delivered after a higher one).
func (fr *faultReceiver) count(confirmed map[string]int64) (lost, dup, reorder int) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	seenSeq := map[int64]bool{}
	seenCmid := map[string]int64{}
	var prev int64
	for _, e := range fr.evs {
		switch {
		case seenSeq[e.Seq]:
			dup++
			continue
		case e.Seq < prev:
			reorder++
		}
		seenSeq[e.Seq] = true
		prev = max(prev, e.Seq)
		if e.Kind != wire.KindMsg {
			continue
		}
		if _, ok := seenCmid[e.Cmid]; ok {
			dup++
			continue
		}
		seenCmid[e.Cmid] = e.Seq
	}
	for cmid, seq := range confirmed {
		if s, ok := seenCmid[cmid]; !ok || s != seq {
			lost++
		}
	}
	return lost, dup, reorder
}

// checkLog reads the group's messages from PostgreSQL: every confirmed
// (cmid, seq) must be there (lost), no cmid twice (dup); unconfirmed counts
// the messages stored that no sender saw confirmed (allowed: a sender that
// gave up; here every sender retries until confirmed, so expect 0); holes
// counts the hole rows (seqs allocated to sends that failed).
func (r *faultRun) checkLog(confirmed map[string]int64) (lost, dup, unconfirmed, holes int) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.pgURL)
	if err != nil {
		r.t.Fatalf("%s: reading the log: %v", r.name, err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT seq, cmid FROM events WHERE conv_key = (SELECT conv_key FROM conversations WHERE conv_id = $1) AND kind = 1`, faultConv)
	if err != nil {
		r.t.Fatalf("%s: reading the log: %v", r.name, err)
	}
	logged := map[string]int64{}
	for rows.Next() {
		var seq int64
		var cmid string
		if err := rows.Scan(&seq, &cmid); err != nil {
			r.t.Fatal(err)
		}
		if _, ok := logged[cmid]; ok {
			dup++
		}
		logged[cmid] = seq
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
	for cmid, seq := range confirmed {
		if s, ok := logged[cmid]; !ok || s != seq {
			lost++
		}
	}
	for cmid := range logged {
		if _, ok := confirmed[cmid]; !ok {
			unconfirmed++
		}
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM events WHERE conv_key = (SELECT conv_key FROM conversations WHERE conv_id = $1) AND kind = 0`, faultConv).Scan(&holes); err != nil {
		r.t.Fatal(err)
	}
	return lost, dup, unconfirmed, holes
}

func faultMaxSeq(m map[string]int64) int64 {
	var x int64
	for _, v := range m {
		x = max(x, v)
	}
	return x
}

// faultUsers provisions senders and receivers and the group of them all.
func faultUsers(t *testing.T, adminURL string, senders, receivers int) (snd, rcv []parleytest.Device) {
	t.Helper()
	var members []string
	for i := range senders {
		u := fmt.Sprintf("s%d", i)
		members = append(members, u)
		snd = append(snd, parleytest.ProvisionUser(t, adminURL, u, 1)[0])
	}
	for i := range receivers {
		u := fmt.Sprintf("r%d", i)
		members = append(members, u)
		rcv = append(rcv, parleytest.ProvisionUser(t, adminURL, u, 1)[0])
	}
	if st := parleytest.AdminCall(t, adminURL, "POST", "/v1/conversations",
		map[string]any{"id": faultConv, "kind": "group", "members": members}, nil); st != http.StatusCreated {
		t.Fatalf("creating the group: status %d", st)
	}
	return snd, rcv
}

// faultRoutedTo lists the gateways the routing table names for user's devices
// (entries "<token>|<gateway>|<boot>"; "#<device>" fields are token
// counters).
func faultRoutedTo(t *testing.T, rdb redis.UniversalClient, prefix, user string) []string {
	t.Helper()
	vals, err := rdb.HGetAll(context.Background(), prefix+"rt:{"+user+"}").Result()
	if err != nil {
		t.Fatalf("reading the routes of %s: %v", user, err)
	}
	var gws []string
	for dev, v := range vals {
		if parts := strings.SplitN(v, "|", 3); !strings.HasPrefix(dev, "#") && len(parts) == 3 {
			gws = append(gws, parts[1])
		}
	}
	return gws
}

func faultFixed(addr string) func() string { return func() string { return addr } }

// onOneGateway connects every participant to the gateway at addr: rcv as
// receivers, the first three of snd as bare-connection senders, and the
// fourth as a client-library sender that also receives.
func (r *faultRun) onOneGateway(addr string, snd, rcv []parleytest.Device) {
	for _, d := range rcv {
		r.receiver(d.User, addr, d)
	}
	for _, d := range snd[:3] {
		r.connSender(d.User, faultFixed(addr), d)
	}
	r.clientSender(snd[3].User, r.receiver(snd[3].User, addr, snd[3]).c)
}

// TestFaultRedisRestartedEmptyMidLoad: the private Redis is killed mid-load
// and restarted empty. Sends get UNAVAILABLE meanwhile; nothing confirmed is
// lost; the counters are re-seeded from PostgreSQL; the gateway's lease
// renewal notices the lost lease and re-registers its connections' routes;
// pushes lost meanwhile are repaired by the receivers' gap syncs.
func TestFaultRedisRestartedEmptyMidLoad(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	rs := testenv.StartRedis(t)
	cfg := parleytest.Config(t)
	cfg.RedisURL, cfg.RedisPrefix = rs.URL(), "fr:"
	cfg.RedisCluster = "" // this test's own Redis, even under PARLEY_TEST_REDIS_CLUSTER
	cfg.SendRate = 0
	cfg.GatewayLease = 3 * time.Second
	env := parleytest.Start(t, cfg)
	snd, rcv := faultUsers(t, env.AdminURL, 4, 4)

	run := newFaultRun(t, "redis-restart", cfg.PostgresURL)
	run.onOneGateway(env.Addr, snd, rcv)

	run.warmUp(60)
	rdb := redis.NewClient(mustParse(t, rs.URL()))
	defer rdb.Close()
	down := time.Now()
	rs.Kill()
	// Down for at least a second (on purpose), and until a send got
	// UNAVAILABLE: go-redis retries a command by itself (4 attempts of 5
	// dials each, about 2.5 s), so a shorter outage only makes sends stall.
	// (A poll by hand, not testenv.CheckFor: without UNAVAILABLE the test
	// goes on, fails below, and finish still accounts for every message.)
	time.Sleep(time.Second)
	for end := down.Add(8 * time.Second); time.Now().Before(end) && run.code(wire.Unavailable) == 0; {
		time.Sleep(10 * time.Millisecond) // the poll's interval
	}
	rs.Restart()
	up := time.Now()
	sendsOK := run.waitSendsOK(up)
	// Routes come back with the next lease renewal (every lease/3).
	var routesBack time.Duration
	testenv.CheckFor(t, 2*cfg.GatewayLease, 20*time.Millisecond, func() error {
		for _, d := range append(slices.Clone(rcv), snd[3]) {
			if gws := faultRoutedTo(t, rdb, cfg.RedisPrefix, d.User); len(gws) == 0 {
				return fmt.Errorf("route of %s not re-registered", d.User)
			}
		}
		routesBack = time.Since(up)
		return nil
	})
	time.Sleep(1500 * time.Millisecond) // on purpose: load after recovery, counted by finish
	if run.code(wire.Unavailable) == 0 {
		t.Errorf("no send got UNAVAILABLE while Redis was down")
	}
	run.finish(fmt.Sprintf(" redis_down=%v sends_ok_after_restart=%v routes_back_after_restart=%v",
		up.Sub(down).Round(time.Millisecond), sendsOK.Round(time.Millisecond), routesBack.Round(time.Millisecond)))
}

// faultProxy forwards TCP connections to a target that the test can
// switch (a load balancer taking a dead gateway out of rotation).
type faultProxy struct {
	ln     net.Listener
	target atomic.Pointer[string]
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func newFaultProxy(t *testing.T, target string) *faultProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, conns: map[net.Conn]struct{}{}}
	p.target.Store(&target)
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *faultProxy) Addr() string          { return p.ln.Addr().String() }
func (p *faultProxy) SetTarget(addr string) { p.target.Store(&addr) }

func (p *faultProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.forward(c)
	}
}

func (p *faultProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *faultProxy) forward(c net.Conn) {
	defer p.wg.Done()
	defer c.Close()
	b, err := net.DialTimeout("tcp", *p.target.Load(), time.Second)
	if err != nil {
		return
	}
	defer b.Close()
	if !p.track(c, b) {
		return
	}
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		delete(p.conns, b)
		p.mu.Unlock()
	}()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(b, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, b); done <- struct{}{} }()
	<-done // either side ended: end both
	c.Close()
	b.Close()
	<-done
}

func (p *faultProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// TestFaultGatewaySIGKILLMidLoad: two parleyd processes share PostgreSQL and
// Redis; most clients reach gateway 1 through a proxy, a few connect to
// gateway 2 directly. Gateway 1 is SIGKILLed mid-load and the proxy
// switches to gateway 2. The clients reconnect, their routes move to
// gateway 2, and every receiver resyncs; nothing confirmed is lost. Route
// convergence (SIGKILL until every moved receiver is routed to gateway 2,
// and until it is reconnected and caught up with every message confirmed
// before the kill) is measured against gateway_lease + 5 s.
func TestFaultGatewaySIGKILLMidLoad(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	cfg.GatewayLease = 3 * time.Second
	gw1 := parleytest.StartProcess(t, cfg)
	gw2 := parleytest.StartProcess(t, cfg)
	proxy := newFaultProxy(t, gw1.Addr)
	snd, rcv := faultUsers(t, gw1.AdminURL, 4, 4)

	run := newFaultRun(t, "gateway-sigkill", cfg.PostgresURL)
	var moved []*faultReceiver // the ones on gateway 1
	var movedUsers []string
	for i, d := range rcv {
		if i == len(rcv)-1 {
			run.receiver(d.User, gw2.Addr, d)
			continue
		}
		moved = append(moved, run.receiver(d.User, proxy.Addr(), d))
		movedUsers = append(movedUsers, d.User)
	}
	run.connSender(snd[0].User, proxy.Addr, snd[0])
	run.connSender(snd[1].User, proxy.Addr, snd[1])
	run.connSender(snd[2].User, faultFixed(gw2.Addr), snd[2])
	cs := run.receiver(snd[3].User, proxy.Addr(), snd[3])
	moved = append(moved, cs)
	movedUsers = append(movedUsers, snd[3].User)
	run.clientSender(snd[3].User, cs.c)

	run.warmUp(60)
	before := make([]*client.Conn, len(moved))
	for i, fr := range moved {
		before[i] = fr.c.Conn()
	}
	atKill := run.maxConfirmed()
	killedAt := time.Now()
	gw1.Kill()
	proxy.SetTarget(gw2.Addr)

	rdb := parleytest.RedisClient(t, cfg)
	gw2ID := gw2.Cfg.GatewayID
	var routed, resynced, leaseGone time.Duration
	converged := make([]bool, len(moved))
	// A poll by hand, not testenv.CheckFor: convergence that fails or is
	// late is reported below with t.Errorf, and finish still accounts for
	// every message.
	for deadline := killedAt.Add(20 * time.Second); time.Now().Before(deadline) && (routed == 0 || resynced == 0 || leaseGone == 0); time.Sleep(10 * time.Millisecond) {
		// The dead gateway's lease (and with it every entry naming
		// it) expires within gateway_lease.
		if leaseGone == 0 {
			n, err := rdb.Exists(context.Background(), cfg.RedisPrefix+"gw:"+gw1.Cfg.GatewayID).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				leaseGone = time.Since(killedAt)
			}
		}
		if routed == 0 {
			all := true
			for _, u := range movedUsers {
				all = all && slices.Equal(faultRoutedTo(t, rdb, cfg.RedisPrefix, u), []string{gw2ID})
			}
			if all {
				routed = time.Since(killedAt)
			}
		}
		if resynced == 0 {
			all := true
			for i, fr := range moved {
				if !converged[i] {
					c := fr.c.Conn()
					converged[i] = c != nil && c != before[i] && fr.c.State() == client.Connected && fr.c.Cursor(faultConv) >= atKill
				}
				all = all && converged[i]
			}
			if all {
				resynced = time.Since(killedAt)
			}
		}
	}
	if leaseGone == 0 {
		t.Errorf("the dead gateway's lease was still there %v after the SIGKILL (gateway_lease %v)", time.Since(killedAt), cfg.GatewayLease)
	} else if leaseGone > cfg.GatewayLease+time.Second {
		t.Errorf("the dead gateway's lease expired %v after the SIGKILL (gateway_lease %v)", leaseGone, cfg.GatewayLease)
	}
	target := cfg.GatewayLease + 5*time.Second
	if routed == 0 || resynced == 0 {
		t.Errorf("no route convergence within 20 s: routed=%v resynced=%v", routed, resynced)
	} else if max(routed, resynced) > target {
		t.Errorf("route convergence took %v (routes) / %v (resynced), target gateway_lease + 5 s = %v", routed, resynced, target)
	}
	time.Sleep(1500 * time.Millisecond) // on purpose: load on gateway 2 alone, counted by finish
	run.finish(fmt.Sprintf(" max_seq_at_kill=%d routes_converged=%v receivers_resynced=%v target=%v dead_lease_expired=%v",
		atKill, routed.Round(time.Millisecond), resynced.Round(time.Millisecond), target, leaseGone.Round(time.Millisecond)))
}

// TestFaultPostgresRestartedMidLoad: the server's private PostgreSQL is
// stopped (fast shutdown) mid-load and started again a second later.
// Sends get UNAVAILABLE meanwhile and no other error code; nothing
// confirmed is lost; the server recovers without a restart: sends succeed
// again and /readyz turns 200.
func TestFaultPostgresRestartedMidLoad(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	pg := testenv.StartPostgres(t)
	cfg := config.Default()
	cfg.PostgresURL = pg.URL()
	cfg.RedisURL, cfg.RedisPrefix = testenv.Redis(t)
	cfg.AdminToken = parleytest.AdminToken
	cfg.PostgresMaxConns = 8
	cfg.SendRate = 0
	cfg.MetricsListen = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	env := parleytest.Start(t, cfg)
	readyz := "http://" + env.Srv.MetricsAddr() + "/readyz"
	ready := func() int {
		c := http.Client{Timeout: 3 * time.Second}
		resp, err := c.Get(readyz)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := ready(); st != http.StatusOK {
		t.Fatalf("/readyz before the fault: %d", st)
	}
	snd, rcv := faultUsers(t, env.AdminURL, 4, 4)

	run := newFaultRun(t, "postgres-restart", cfg.PostgresURL)
	run.onOneGateway(env.Addr, snd, rcv)

	run.warmUp(60)
	down := time.Now()
	pg.Stop()
	if st := ready(); st != http.StatusServiceUnavailable {
		t.Errorf("/readyz while PostgreSQL is down: %d, want 503", st)
	}
	time.Sleep(time.Second) // on purpose: PostgreSQL stays down for a second
	pg.Start()
	up := time.Now()
	sendsOK := run.waitSendsOK(up)
	var readyAfter time.Duration
	testenv.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if st := ready(); st != http.StatusOK {
			return fmt.Errorf("/readyz after PostgreSQL came back: %d", st)
		}
		readyAfter = time.Since(up)
		return nil
	})
	time.Sleep(1500 * time.Millisecond) // on purpose: load after recovery, counted by finish
	if run.code(wire.Unavailable) == 0 {
		t.Errorf("no send got UNAVAILABLE while PostgreSQL was down")
	}
	run.finish(fmt.Sprintf(" postgres_down=%v sends_ok_after_start=%v readyz_ok_after_start=%v",
		up.Sub(down).Round(time.Millisecond), sendsOK.Round(time.Millisecond), readyAfter.Round(time.Millisecond)))
}
