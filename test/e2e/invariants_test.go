package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/route"
	"github.com/parley-im/parley/scripts"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
	"github.com/parley-im/parley/wire"
)

// syncAll pages through conv by upto only, as a client must, and returns
// every event it saw.
func syncAll(t *testing.T, c *client.Conn, conv string, after int64) ([]wire.Event, int64) {
	t.Helper()
	var evs []wire.Event
	// A page with more and no events: a seq in flight. Try again shortly.
	testenv.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		for {
			r, err := c.Sync(ctx(t), conv, after, 50)
			if err != nil {
				t.Fatalf("sync after %d: %v", after, err)
			}
			evs = append(evs, r.Events...)
			if r.Upto < after {
				t.Fatalf("upto %d went below after %d", r.Upto, after)
			}
			after = r.Upto
			if !r.More {
				return nil
			}
			if len(r.Events) == 0 {
				return fmt.Errorf("sync of %s did not reach head %d: upto %d", conv, r.Head, r.Upto)
			}
		}
	})
	return evs, after
}

// TestRedisFlushAndRestartLoseNothing: senders keep sending while the
// test flushes its own Redis and later kills and restarts it empty; every
// confirmed message is in the log afterwards with its confirmed seq, and
// no seq repeats.
func TestRedisFlushAndRestartLoseNothing(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	rs := testenv.StartRedis(t)
	cfg := parleytest.Config(t)
	cfg.RedisURL, cfg.RedisPrefix = rs.URL(), "d1:"
	cfg.RedisCluster = "" // this test's own Redis, even under PARLEY_TEST_REDIS_CLUSTER
	cfg.SendRate = 0
	cfg.GatewayLease = 3 * time.Second
	cfg.HoleTimeout = 500 * time.Millisecond
	env := parleytest.Start(t, cfg)
	const senders, perSender = 4, 150
	members, devs := env.Users(t, "u%d", senders)
	env.Group(t, "g", members...)

	var mu sync.Mutex
	confirmed := map[string]int64{} // cmid -> seq
	var sent atomic.Int64
	var wg sync.WaitGroup
	for i, d := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c *client.Conn
			for n := 0; n < perSender; n++ {
				cmid := fmt.Sprintf("s%d-%d", i, n)
				for attempt := 0; attempt < 100; attempt++ {
					if c == nil {
						dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
						c, _ = client.Dial(dctx, env.Addr, d.ID, d.Token, client.DialOptions{})
						cancel()
						if c == nil {
							time.Sleep(50 * time.Millisecond) // the load's own retry pacing
							continue
						}
					}
					sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					r, err := c.Send(sctx, "g", cmid, []byte(cmid))
					cancel()
					if err == nil {
						mu.Lock()
						if prev, ok := confirmed[cmid]; ok && prev != r.Seq {
							t.Errorf("cmid %s confirmed twice with seqs %d and %d", cmid, prev, r.Seq)
						}
						confirmed[cmid] = r.Seq
						mu.Unlock()
						sent.Add(1)
						break
					}
					if errors.Is(err, client.ErrClosed) {
						c = nil
					}
					time.Sleep(20 * time.Millisecond) // UNAVAILABLE while Redis is down: the load's retry pacing, same cmid
				}
			}
			if c != nil {
				c.Close()
			}
		}()
	}
	testenv.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		if sent.Load() < senders*perSender/3 {
			return fmt.Errorf("only %d sent", sent.Load())
		}
		return nil
	})
	rs.Flush()
	testenv.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		if sent.Load() < 2*senders*perSender/3 {
			return fmt.Errorf("only %d sent", sent.Load())
		}
		return nil
	})
	rs.Kill()
	time.Sleep(300 * time.Millisecond) // on purpose: an outage of 300 ms, some sends fail with UNAVAILABLE meanwhile
	rs.Restart()
	wg.Wait()
	if len(confirmed) != senders*perSender {
		t.Fatalf("%d of %d sends confirmed", len(confirmed), senders*perSender)
	}

	reader, _ := dial(t, env, devs[0])
	evs, _ := syncAll(t, reader, "g", 0)
	seen := map[int64]bool{}
	byCmid := map[string]int64{}
	for _, e := range evs {
		if seen[e.Seq] {
			t.Fatalf("seq %d repeated", e.Seq)
		}
		seen[e.Seq] = true
		if e.Kind == "msg" {
			byCmid[e.Cmid] = e.Seq
		}
	}
	for cmid, seq := range confirmed {
		if got, ok := byCmid[cmid]; !ok || got != seq {
			t.Errorf("confirmed %s at seq %d; log has %d (present %v)", cmid, seq, got, ok)
		}
	}
	if len(byCmid) != len(confirmed) {
		t.Errorf("log has %d messages, %d confirmed", len(byCmid), len(confirmed))
	}
}

// TestRacingSendersReaderByUpto: 16 senders on two gateways race a
// reader that advances only by upto; an allocated seq that never commits
// (a sender that died after INCR) stalls the reader only until the hole
// timeout. The reader ends with exactly every confirmed seq.
func TestRacingSendersReaderByUpto(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	cfg.HoleTimeout = 300 * time.Millisecond
	gw1 := parleytest.Start(t, cfg)
	gw2 := parleytest.Start(t, cfg)
	const senders, perSender = 16, 40
	var members []string
	var devs []parleytest.Device
	for i := 0; i < senders; i++ {
		u := fmt.Sprintf("s%02d", i)
		members = append(members, u)
		devs = append(devs, gw1.User(t, u, 1)[0])
	}
	rd := gw1.User(t, "reader", 1)[0]
	gw1.Group(t, "race", append(members, "reader")...)

	// A sender that dies between INCR and COMMIT: allocate a seq by hand.
	rdb := parleytest.RedisClient(t, cfg)
	if err := scripts.SeqAlloc.Run(context.Background(), rdb, []string{cfg.RedisPrefix + "seq:{race}"}, 1).Err(); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	confirmed := map[int64]bool{}
	var wg sync.WaitGroup
	done := make(chan struct{})
	for i, d := range devs {
		env := gw1
		if i%2 == 1 {
			env = gw2
		}
		c, _ := dial(t, env, d)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < perSender; n++ {
				r, err := c.Send(ctx(t), "race", fmt.Sprintf("%d-%d", i, n), []byte("x"))
				if err != nil {
					t.Errorf("send: %v", err)
					return
				}
				mu.Lock()
				confirmed[r.Seq] = true
				mu.Unlock()
			}
		}()
	}
	// A slow sender: its seq is allocated now but its transaction commits
	// only after later seqs did (and after the hole timeout passed, so a
	// reader tries to fence the seq while the insert is still open).
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(50 * time.Millisecond) // pacing: the slow seq is allocated amid the senders' load, not before it
		c := context.Background()
		// Connected first: on a loaded host, connecting after the seq
		// was allocated can take longer than the hole timeout, and the
		// reader then rightly fences the seq before the insert begins.
		conn, err := pgx.Connect(c, cfg.PostgresURL)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(c)
		tx, err := conn.Begin(c)
		if err != nil {
			t.Error(err)
			return
		}
		s, err := allocByHand(c, rdb, cfg.RedisPrefix+"seq:{race}")
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := tx.Exec(c, `INSERT INTO events (conv_key, seq, kind, sender, cmid, body, ts)
			SELECT conv_key, $1, 1, 's00', 'slow', 'x', $2 FROM conversations WHERE conv_id = 'race'`,
			s, time.Now().UnixMilli()); err != nil {
			t.Error(err)
			return
		}
		time.Sleep(time.Second) // on purpose: the insert stays open past the hole timeout while later seqs commit
		if err := tx.Commit(c); err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		confirmed[s] = true
		mu.Unlock()
	}()
	go func() { wg.Wait(); close(done) }()

	reader, _ := dial(t, gw2, rd)
	got := map[int64]bool{}
	var after int64
	finished := false
	// The reader syncs while the senders run, and until it has reached
	// the head after they finished.
	testenv.CheckFor(t, 30*time.Second, 2*time.Millisecond, func() error {
		for {
			select {
			case <-done:
				finished = true
			default:
			}
			r, err := reader.Sync(ctx(t), "race", after, 7)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range r.Events {
				if e.Seq <= after || e.Seq > r.Upto {
					t.Fatalf("event %d outside (%d, %d]", e.Seq, after, r.Upto)
				}
				if got[e.Seq] {
					t.Fatalf("seq %d returned twice", e.Seq)
				}
				if e.Kind == "msg" {
					got[e.Seq] = true
				}
			}
			after = r.Upto
			if r.More {
				continue
			}
			if !finished {
				return fmt.Errorf("senders did not finish (reader at %d)", after)
			}
			return nil
		}
	})
	if len(confirmed) != senders*perSender+1 {
		t.Fatalf("%d confirmed, want %d", len(confirmed), senders*perSender+1)
	}
	for s := range confirmed {
		if !got[s] {
			t.Errorf("confirmed seq %d never reached the reader", s)
		}
	}
	for s := range got {
		if !confirmed[s] {
			t.Errorf("reader got seq %d that nobody confirmed", s)
		}
	}
}

func mustParse(t *testing.T, url string) *redis.Options {
	o, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestSameCmidFromTwoDevices: the same (sender, cmid) sent at once from
// two devices of the sender is stored once; both get the same seq.
func TestSameCmidFromTwoDevices(t *testing.T) {
	t.Parallel()
	env := parleytest.Start(t, parleytest.Config(t))
	ana := env.User(t, "ana", 2)
	env.User(t, "ben", 1)
	env.Group(t, "g", "ana", "ben")
	c1, _ := dial(t, env, ana[0])
	c2, _ := dial(t, env, ana[1])
	for i := 0; i < 20; i++ {
		cmid := fmt.Sprintf("m%d", i)
		var r1, r2 wire.Message
		var e1, e2 error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); r1, e1 = c1.Send(ctx(t), "g", cmid, []byte("a")) }()
		go func() { defer wg.Done(); r2, e2 = c2.Send(ctx(t), "g", cmid, []byte("a")) }()
		wg.Wait()
		if e1 != nil || e2 != nil {
			t.Fatal(e1, e2)
		}
		if r1.Seq != r2.Seq || r1.Dup == r2.Dup || r1.Ts != r2.Ts {
			t.Fatalf("%s: replies %+v and %+v", cmid, r1, r2)
		}
	}
	evs, _ := syncAll(t, c1, "g", 0)
	n := 0
	for _, e := range evs {
		if e.Kind == "msg" {
			n++
		}
	}
	if n != 20 {
		t.Fatalf("%d messages stored, want 20", n)
	}
}

// TestAckMaxMergeNeverAboveHead: cursors only grow, are durable in
// PostgreSQL and hot in Redis, never exceed head, and need membership.
func TestAckMaxMergeNeverAboveHead(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	env := parleytest.Start(t, cfg)
	ana := env.User(t, "ana", 1)
	ben := env.User(t, "ben", 2)
	env.User(t, "cy", 1)
	env.Group(t, "g", "ana", "ben")
	env.Group(t, "other", "ana", "cy")
	ca, _ := dial(t, env, ana[0])
	for i := 0; i < 10; i++ {
		if _, err := ca.Send(ctx(t), "g", fmt.Sprint(i), []byte("m")); err != nil {
			t.Fatal(err)
		}
	}
	cb, _ := dial(t, env, ben[0])
	for _, step := range []struct{ ack, want int64 }{{5, 5}, {3, 5}, {11, 11}, {0, 11}} {
		r, err := cb.Ack(ctx(t), "g", step.ack)
		if err != nil || r.Delivered != step.want {
			t.Fatalf("ack %d: %+v %v, want delivered %d", step.ack, r, err, step.want)
		}
	}
	if _, err := cb.Ack(ctx(t), "g", 12); wire.CodeOf(err) != wire.CursorAhead {
		t.Fatalf("ack above head: %v", err)
	}
	if _, err := cb.Ack(ctx(t), "other", 1); wire.CodeOf(err) != wire.NotMember {
		t.Fatalf("ack in a conversation never joined: %v", err)
	}
	// Durable and hot copies agree; the other device's cursor is untouched.
	conn, err := pgx.Connect(ctx(t), cfg.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var pg int64
	if err := conn.QueryRow(ctx(t), `SELECT delivered_seq FROM device_cursors WHERE device_id=$1 AND conv_id='g'`, ben[0].ID).Scan(&pg); err != nil || pg != 11 {
		t.Fatalf("postgres cursor %d, %v", pg, err)
	}
	var others int
	_ = conn.QueryRow(ctx(t), `SELECT count(*) FROM device_cursors WHERE device_id=$1`, ben[1].ID).Scan(&others)
	if others != 0 {
		t.Fatalf("the other device got %d cursors", others)
	}
	rdb := parleytest.RedisClient(t, cfg)
	hot, err := rdb.HGet(ctx(t), cfg.RedisPrefix+"dc:{ben}:"+ben[0].ID, "g").Int64()
	if err != nil || hot != 11 {
		t.Fatalf("redis cursor %d, %v", hot, err)
	}
	// Reinstall: the old connection's acks are refused, the new install starts at 0.
	var re struct {
		InstallEpoch int64 `json:"install_epoch"`
	}
	if st := env.Admin(t, "POST", "/v1/devices/"+ben[0].ID+"/reinstall", nil, &re); st != http.StatusOK || re.InstallEpoch != 1 {
		t.Fatalf("reinstall: %d %+v", st, re)
	}
	if _, err := cb.Ack(ctx(t), "g", 11); wire.CodeOf(err) != wire.StaleInstall {
		t.Fatalf("ack from the old install: %v", err)
	}
	cb2, pushes := dial(t, env, ben[0])
	if cb2.Auth.InstallEpoch != 1 {
		t.Fatalf("new install epoch %d", cb2.Auth.InstallEpoch)
	}
	if r, err := cb2.Ack(ctx(t), "g", 2); err != nil || r.Delivered != 2 {
		t.Fatalf("new install ack: %+v %v", r, err)
	}
	// The acks above were of seqs this connection was never given, checked
	// in full in PostgreSQL; an ack of a pushed seq skips the membership and
	// head checks, and one above it is checked in full again.
	if _, err := ca.Send(ctx(t), "g", "pushed", []byte("m")); err != nil {
		t.Fatal(err)
	}
	waitPush(t, pushes, "g", 12)
	if r, err := cb2.Ack(ctx(t), "g", 12); err != nil || r.Delivered != 12 {
		t.Fatalf("ack of the pushed seq: %+v %v", r, err)
	}
	if _, err := cb2.Ack(ctx(t), "g", 13); wire.CodeOf(err) != wire.CursorAhead {
		t.Fatalf("ack above the pushed head: %v", err)
	}
	if _, err := cb2.Ack(ctx(t), "other", 0); wire.CodeOf(err) != wire.NotMember {
		t.Fatalf("ack of 0 in a conversation never joined: %v", err)
	}
}

// TestRouteFencingAndLeases: an older registration never overwrites a newer
// one, and a dead gateway's entries are not used once its lease is gone.
func TestRouteFencingAndLeases(t *testing.T) {
	t.Parallel()
	url, prefix := testenv.Redis(t)
	rdb := redis.NewClient(mustParse(t, url))
	defer rdb.Close()
	c := context.Background()
	if err := scripts.Load(c, rdb); err != nil {
		t.Fatal(err)
	}
	a := route.New(rdb, prefix, "gw-a", "boot-a", 2*time.Second)
	b := route.New(rdb, prefix, "gw-b", "boot-b", 2*time.Second)
	if err := a.RenewLease(c); err != nil {
		t.Fatal(err)
	}
	if err := b.RenewLease(c); err != nil {
		t.Fatal(err)
	}
	t1, _, err := a.Register(c, "u", "dev", 0)
	if err != nil {
		t.Fatal(err)
	}
	t2, prev, err := b.Register(c, "u", "dev", 0)
	if err != nil || t2 <= t1 || prev == nil || prev.Token != t1 || prev.Gateway != "gw-a" {
		t.Fatalf("second registration: %d %+v %v", t2, prev, err)
	}
	// The old connection's gateway re-registers late (e.g. after Redis lost
	// the table): fenced.
	if _, cur, err := a.Register(c, "u", "dev", t1); !errors.Is(err, route.ErrFenced) || cur.Token != t2 {
		t.Fatalf("late registration: %+v %v", cur, err)
	}
	// The old connection closes: it must not remove the newer entry.
	if err := a.Unregister(c, "u", "dev", t1); err != nil {
		t.Fatal(err)
	}
	es, err := a.Lookup(c, []string{"u"})
	if err != nil || len(es) != 1 || es[0].Token != t2 || es[0].Gateway != "gw-b" {
		t.Fatalf("lookup: %+v %v", es, err)
	}
	// gw-b dies: its lease expires; its entry stops being used and is reaped.
	if err := b.DropLease(c); err != nil {
		t.Fatal(err)
	}
	testenv.CheckFor(t, 3*time.Second, 50*time.Millisecond, func() error {
		es, err := a.Lookup(c, []string{"u"})
		if err != nil {
			return err
		}
		if len(es) != 0 {
			return fmt.Errorf("dead gateway's entry still used: %+v", es)
		}
		return nil
	})
	if n, _ := rdb.HLen(c, prefix+"rt:{u}").Result(); n != 1 { // only the "#dev" token counter is left
		t.Fatalf("dead entry not reaped: %d fields", n)
	}
}

// TestReplacedAcrossGateways: a second connection of a device on another
// gateway kicks the first ("replaced").
func TestReplacedAcrossGateways(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	gw1 := parleytest.Start(t, cfg)
	gw2 := parleytest.Start(t, cfg)
	d := gw1.User(t, "ana", 1)[0]
	_, f1 := dial(t, gw1, d)
	c2, _ := dial(t, gw2, d)
	deadline := time.After(5 * time.Second)
	for {
		select {
		case m := <-f1:
			if m.T == wire.TKick && m.Reason == "replaced" {
				if err := c2.Ping(ctx(t)); err != nil {
					t.Fatal(err)
				}
				return
			}
		case <-deadline:
			t.Fatal("first connection not kicked")
		}
	}
}

// TestTwoProcessesExchangePushes: two parleyd processes on one PostgreSQL
// and one Redis deliver each other's messages.
func TestTwoProcessesExchangePushes(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	p1 := parleytest.StartProcess(t, cfg)
	p2 := parleytest.StartProcess(t, cfg)
	ana := parleytest.ProvisionUser(t, p1.AdminURL, "ana", 1)[0]
	ben := parleytest.ProvisionUser(t, p2.AdminURL, "ben", 1)[0]
	if st := parleytest.AdminCall(t, p1.AdminURL, "POST", "/v1/conversations",
		map[string]any{"id": "g", "kind": "group", "members": []string{"ana", "ben"}}, nil); st != http.StatusCreated {
		t.Fatal(st)
	}
	ca, fa := dial(t, &parleytest.Env{Addr: p1.Addr}, ana)
	cb, fb := dial(t, &parleytest.Env{Addr: p2.Addr}, ben)
	r, err := ca.Send(ctx(t), "g", "1", []byte("from p1"))
	if err != nil {
		t.Fatal(err)
	}
	if m := waitPush(t, fb, "g", r.Seq); string(m.Body) != "from p1" {
		t.Fatalf("push %+v", m)
	}
	r, err = cb.Send(ctx(t), "g", "2", []byte("from p2"))
	if err != nil {
		t.Fatal(err)
	}
	if m := waitPush(t, fa, "g", r.Seq); string(m.Body) != "from p2" {
		t.Fatalf("push %+v", m)
	}
}

// allocByHand allocates one seq from the counter key with seq_alloc, as a
// sender would before it commits.
func allocByHand(ctx context.Context, rdb redis.UniversalClient, key string) (int64, error) {
	lasts, err := scripts.SeqAlloc.Run(ctx, rdb, []string{key}, 1).Int64Slice()
	if err == nil && len(lasts) != 1 {
		err = fmt.Errorf("seq_alloc replied %v", lasts)
	}
	if err != nil {
		return 0, err
	}
	return lasts[0], nil
}
