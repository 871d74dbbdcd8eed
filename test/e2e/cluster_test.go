//go:build linux

package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
	"github.com/parley-im/parley/wire"
)

// TestClusterTwoGatewaysFailover runs two gateways over one private 6-node
// Redis Cluster (redis_cluster; 3 masters, 3 replicas) and one PostgreSQL:
// cross-gateway pushes, acks and reads (with their hot copies on the
// cluster), a device replaced across gateways, and then the fault
// experiment's steady load (faults_test.go) on a group while the shard
// holding the group's seq counter (and gateway 1's bus subscription) fails
// over twice: SIGKILL of its master (its replica takes over), then the
// killed node comes back empty and a manual CLUSTER FAILOVER makes it the
// master again (NOSCRIPT there). Then every node's script cache is flushed,
// and the counter is set back and deleted (what a replica that lagged its
// dead master would show). Sends may get UNAVAILABLE during a failover; at
// the end no confirmed message is lost, duplicated or out of order, no seq
// repeats, and pushes, kicks, acks and reads work across gateways again.
func TestClusterTwoGatewaysFailover(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	began := time.Now()
	rc := testenv.StartRedisCluster(t)
	clusterUp := time.Since(began)
	rdb := rc.Client()

	cfg := parleytest.Config(t)
	cfg.RedisCluster = rc.Seeds()
	cfg.RedisURL = "redis://127.0.0.1:1/0" // must not be used
	cfg.SendRate = 0
	cfg.GatewayLease = 6 * time.Second
	cfg.HoleTimeout = 500 * time.Millisecond
	seqKey := cfg.RedisPrefix + "seq:{" + faultConv + "}"
	busOf := func(gw string) string { return cfg.RedisPrefix + "bus:" + gw }
	// Gateway 1's bus channel lives on the shard of the group's seq
	// counter, the one that fails over; gateway 2's on another shard.
	shard, _ := rc.MasterFor(seqKey)
	cfg1, cfg2 := cfg, cfg
	for i := 0; cfg1.GatewayID == "" || cfg2.GatewayID == ""; i++ {
		if i == 100 {
			t.Fatal("no gateway ids found for the shards wanted")
		}
		id := fmt.Sprintf("cgw-%d", i)
		m, _ := rc.MasterFor(busOf(id))
		switch {
		case m == shard && cfg1.GatewayID == "":
			cfg1.GatewayID = id
		case m != shard && cfg2.GatewayID == "":
			cfg2.GatewayID = id
		}
	}
	gw1 := parleytest.Start(t, cfg1)
	gw2 := parleytest.Start(t, cfg2)

	// Across gateways: pushes both ways, ack and read with their hot copies.
	xa := gw1.User(t, "xa", 1)[0]
	xb := gw1.User(t, "xb", 1)[0]
	gw1.Group(t, "x", "xa", "xb")
	ca, fa := dial(t, gw1, xa)
	cb, fb := dial(t, gw2, xb)
	// state describes, for a failure message, what the routing table and
	// the bus look like for user.
	state := func(user string) string {
		c := context.Background()
		rt, err := rdb.HGetAll(c, cfg.RedisPrefix+"rt:{"+user+"}").Result()
		out := fmt.Sprintf("routes of %s: %v %v", user, rt, err)
		for _, id := range []string{cfg1.GatewayID, cfg2.GatewayID} {
			lease, err := rdb.Get(c, cfg.RedisPrefix+"gw:"+id).Result()
			out += fmt.Sprintf("; lease of %s: %q %v; its bus subscribers:", id, lease, err)
			for _, addr := range rc.Addrs() {
				cl := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
				if n, err := cl.PubSubNumSub(c, busOf(id)).Result(); err == nil && n[busOf(id)] > 0 {
					out += fmt.Sprintf(" %s:%d", addr, n[busOf(id)])
				}
				cl.Close()
			}
		}
		return out
	}
	// exchange checks, within wait, that a message sent on each gateway is
	// pushed to the device on the other, and that an ack and a read commit
	// and reach their hot copies on the cluster. Right after a failover a
	// push (a hint) or a hot copy (best effort) may be lost while a
	// gateway still talks to the dead node: it tries again with new
	// messages until wait has passed.
	n := 0
	exchange := func(step string, wait time.Duration) {
		t.Helper()
		deadline := time.Now().Add(wait)
		attempt := 0
		var last string
		fail := func(format string, args ...any) error {
			last = fmt.Sprintf(format, args...)
			return fmt.Errorf("%s: not working across gateways; last failure: %s", step, last)
		}
		testenv.CheckFor(t, wait, 200*time.Millisecond, func() error {
			defer func() { attempt++ }()
			n++
			try := max(min(3*time.Second, time.Until(deadline)), 200*time.Millisecond)
			r, err := ca.Send(ctx(t), "x", fmt.Sprintf("%s-a%d", step, n), []byte("from gw1"))
			if err != nil {
				return fail("send on gateway 1: %v", err)
			}
			if !clusterPushed(fb, "x", r.Seq, try) {
				return fail("gateway 1 -> gateway 2: no push of x/%d within %v (%s)", r.Seq, try, state("xb"))
			}
			r2, err := cb.Send(ctx(t), "x", fmt.Sprintf("%s-b%d", step, n), []byte("from gw2"))
			if err != nil {
				return fail("send on gateway 2: %v", err)
			}
			if !clusterPushed(fa, "x", r2.Seq, try) {
				return fail("gateway 2 -> gateway 1: no push of x/%d within %v (%s)", r2.Seq, try, state("xa"))
			}
			if a, err := cb.Ack(ctx(t), "x", r2.Seq); err != nil || a.Delivered != r2.Seq {
				return fail("ack %d: %+v %v", r2.Seq, a, err)
			}
			if rd, err := cb.Read(ctx(t), "x", r.Seq); err != nil || rd.Read != r.Seq || rd.Unread != 0 {
				return fail("read %d: %+v %v", r.Seq, rd, err)
			}
			c := context.Background()
			if v, err := rdb.HGet(c, cfg.RedisPrefix+"dc:{xb}:"+xb.ID, "x").Int64(); err != nil || v != r2.Seq {
				return fail("hot delivery cursor on the cluster: %d %v, want %d", v, err, r2.Seq)
			}
			if v, err := rdb.HGet(c, cfg.RedisPrefix+"rp:{xb}", "x").Int64(); err != nil || v != r.Seq {
				return fail("hot read position on the cluster: %d %v, want %d", v, err, r.Seq)
			}
			if attempt > 0 {
				t.Logf("%s: pushes, acks and reads across gateways work after %d attempts (last failure: %s)", step, attempt+1, last)
			}
			return nil
		})
	}
	exchange("before", 10*time.Second)

	// A device replaced across gateways: its connection on gateway 1 gets
	// a kick through gateway 1's bus channel.
	kd := gw1.User(t, "k", 1)[0]
	replaced := func(step string, wait time.Duration) time.Duration {
		t.Helper()
		deadline := time.Now().Add(wait)
		_, f1 := clusterDial(t, gw1, kd, deadline)
		t0 := time.Now()
		c2, _ := clusterDial(t, gw2, kd, deadline)
		for {
			select {
			case m := <-f1:
				if m.T == wire.TKick && m.Reason == "replaced" {
					if err := c2.Ping(ctx(t)); err != nil {
						t.Fatalf("%s: the new connection: %v", step, err)
					}
					return time.Since(t0)
				}
			case <-time.After(time.Until(deadline)):
				t.Fatalf("%s: the connection on gateway 1 was not kicked within %v", step, wait)
			}
		}
	}
	replaced("before", 10*time.Second)

	// The load: senders and online receivers on both gateways.
	snd, rcv := faultUsers(t, gw1.AdminURL, 4, 4)
	run := newFaultRun(t, "redis-cluster", cfg.PostgresURL)
	var receivers []*faultReceiver
	for i, d := range rcv {
		env := gw1
		if i%2 == 1 {
			env = gw2
		}
		receivers = append(receivers, run.receiver(d.User, env.Addr, d))
	}
	run.connSender(snd[0].User, faultFixed(gw1.Addr), snd[0])
	run.connSender(snd[1].User, faultFixed(gw2.Addr), snd[1])
	run.connSender(snd[2].User, faultFixed(gw1.Addr), snd[2])
	run.clientSender(snd[3].User, run.receiver(snd[3].User, gw2.Addr, snd[3]).c)
	run.warmUp(40)

	// 1. SIGKILL the counter's master (which also holds gateway 1's bus
	// subscription): its replica takes over after the node timeout; the
	// shard refuses writes meanwhile.
	if m, _ := rc.MasterFor(seqKey); numSub(t, m, busOf(cfg1.GatewayID)) != 1 {
		t.Fatalf("gateway 1's bus subscription is not on %s, the master about to be killed", m)
	}
	t0 := time.Now()
	killed, promoted := rc.KillMasterFor(seqKey)
	tookOver := time.Since(t0)
	afterKill := run.waitSendsOK(time.Now())
	t.Logf("SIGKILL of %s: %s took over after %v; sends confirmed %v later", killed, promoted, tookOver.Round(time.Millisecond), afterKill.Round(time.Millisecond))
	t0 = time.Now()
	exchange("after-sigkill", 20*time.Second)
	pushesBack := time.Since(t0)
	kickBack := replaced("after-sigkill", 20*time.Second)

	// 2. The killed node comes back empty (no data, no scripts) as a
	// replica, and a manual failover makes it the master again: the
	// scripts' EVALSHA gets NOSCRIPT there, in pipelines too.
	rc.Restart(killed)
	t0 = time.Now()
	oldM, newM := rc.Failover(seqKey)
	failedOver := time.Since(t0)
	afterManual := run.waitSendsOK(time.Now())
	t.Logf("manual failover %s -> %s took %v; sends confirmed %v later", oldM, newM, failedOver.Round(time.Millisecond), afterManual.Round(time.Millisecond))
	if n := noScriptErrors(t, newM); n == 0 {
		t.Errorf("the restarted master %s never answered NOSCRIPT", newM)
	}

	// 3. Every node forgets the scripts at once.
	if err := rdb.ForEachShard(context.Background(), func(c context.Context, n *redis.Client) error {
		return n.ScriptFlush(c).Err()
	}); err != nil {
		t.Fatal(err)
	}
	afterFlush := run.waitSendsOK(time.Now())

	// 4. What a lagging replica shows after a crash: the counter went
	// back, or it is missing. Seqs still never repeat.
	c := context.Background()
	if cur, err := rdb.Get(c, seqKey).Int64(); err != nil || cur < 30 {
		t.Fatalf("seq counter after the failovers: %d %v", cur, err)
	} else if err := rdb.Set(c, seqKey, cur-25, 0).Err(); err != nil {
		t.Fatal(err)
	}
	afterBack := run.waitSendsOK(time.Now())
	if err := rdb.Del(c, seqKey).Err(); err != nil {
		t.Fatal(err)
	}
	afterDel := run.waitSendsOK(time.Now())

	exchange("end", 10*time.Second)
	replaced("end", 10*time.Second)

	time.Sleep(time.Second) // on purpose: a second of load after recovery, counted by finish
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	run.finish(fmt.Sprintf(" cluster_up=%v takeover_after_sigkill=%v sends_ok_after_takeover=%v cross_gateway_pushes_after_takeover=%v kick_after_takeover=%v manual_failover=%v sends_ok_after_manual=%v sends_ok_after_script_flush=%v sends_ok_after_counter_back=%v sends_ok_after_counter_del=%v",
		ms(clusterUp), ms(tookOver), ms(afterKill), ms(pushesBack), ms(kickBack), ms(failedOver), ms(afterManual), ms(afterFlush), ms(afterBack), ms(afterDel)))

	// Receivers on both gateways read everything: acks and reads commit,
	// and their hot copies land on the cluster.
	maxSeq := run.maxConfirmed()
	for _, fr := range receivers {
		if r, err := fr.c.Ack(ctx(t), faultConv, maxSeq); err != nil || r.Delivered < maxSeq {
			t.Errorf("%s: ack %d: %+v %v", fr.name, maxSeq, r, err)
		}
		r, err := fr.c.Read(ctx(t), faultConv, maxSeq)
		if err != nil || r.Read != maxSeq || r.Unread != 0 {
			t.Errorf("%s: read %d: %+v %v", fr.name, maxSeq, r, err)
			continue
		}
		if v, err := rdb.HGet(c, cfg.RedisPrefix+"rp:{"+fr.name+"}", faultConv).Int64(); err != nil || v != maxSeq {
			t.Errorf("%s: hot read position on the cluster: %d %v, want %d", fr.name, v, err, maxSeq)
		}
	}
	// The counter is back above everything committed.
	var head int64
	if st := gw2.Admin(t, "GET", "/v1/conversations/"+faultConv, nil, &struct{ Head *int64 }{&head}); st != http.StatusOK {
		t.Errorf("reading the group: status %d", st)
	}
	if cur, err := rdb.Get(c, seqKey).Int64(); err != nil || cur < maxSeq || cur < head {
		t.Errorf("seq counter %d (%v) below max confirmed seq %d or head %d", cur, err, maxSeq, head)
	}
	t.Logf("cluster test took %v", time.Since(began).Round(time.Millisecond))
}

// noScriptErrors is how many NOSCRIPT errors the Redis at addr has
// answered since it started (INFO errorstats).
func noScriptErrors(t *testing.T, addr string) int {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	info, err := c.Info(ctx(t), "errorstats").Result()
	if err != nil {
		t.Fatalf("INFO errorstats on %s: %v", addr, err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "errorstat_NOSCRIPT:count="); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// numSub is how many subscribers channel has on the Redis at addr (on a
// cluster: connected to that node).
func numSub(t *testing.T, addr, channel string) int64 {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	n, err := c.PubSubNumSub(ctx(t), channel).Result()
	if err != nil {
		t.Fatalf("PUBSUB NUMSUB on %s: %v", addr, err)
	}
	return n[channel]
}

// clusterPushed reports whether the push of conv/seq arrives on frames
// within wait.
func clusterPushed(frames chan wire.Message, conv string, seq int64, wait time.Duration) bool {
	deadline := time.After(wait)
	for {
		select {
		case m := <-frames:
			if m.T == wire.TPush && m.Conv == conv && m.Seq == seq {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

// clusterDial is dial, retrying until deadline: right after a failover,
// authentication may get UNAVAILABLE while the gateway still talks to the
// dead node.
func clusterDial(t *testing.T, env *parleytest.Env, dev parleytest.Device, deadline time.Time) (*client.Conn, chan wire.Message) {
	t.Helper()
	frames := make(chan wire.Message, 1024)
	var c *client.Conn
	testenv.CheckFor(t, time.Until(deadline), 100*time.Millisecond, func() error {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		c, err = client.Dial(dctx, env.Addr, dev.ID, dev.Token, client.DialOptions{OnServerFrame: func(m wire.Message) {
			select {
			case frames <- m:
			default:
			}
		}})
		if err != nil {
			return fmt.Errorf("dial %s: %w", dev.ID, err)
		}
		return nil
	})
	t.Cleanup(func() { c.Close() })
	return c, frames
}
