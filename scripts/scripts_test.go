package scripts_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/scripts"
	"github.com/parley-im/parley/test/testenv"
)

// allocBoth runs seq_alloc on k1 and k2 in one RunPipelined and returns
// the counters' values afterwards.
func allocBoth(t *testing.T, rdb redis.UniversalClient, k1, k2 string) (int64, int64) {
	t.Helper()
	ctx := context.Background()
	var c1, c2 *redis.Cmd
	if _, err := scripts.RunPipelined(ctx, rdb, func(p redis.Pipeliner) {
		c1 = scripts.SeqAlloc.EvalSha(ctx, p, []string{k1}, 1)
		c2 = scripts.SeqAlloc.EvalSha(ctx, p, []string{k2}, 1)
	}); err != nil {
		t.Fatalf("RunPipelined: %v", err)
	}
	r1, err1 := only(c1.Int64Slice())
	r2, err2 := only(c2.Int64Slice())
	v1, _ := rdb.Get(ctx, k1).Int64()
	v2, _ := rdb.Get(ctx, k2).Int64()
	if err1 != nil || err2 != nil || r1 != v1 || r2 != v2 {
		t.Fatalf("replies %d %v, %d %v; counters %d, %d", r1, err1, r2, err2, v1, v2)
	}
	return v1, v2
}

// TestRunPipelinedNoScriptOnOneClusterNode: on a Redis Cluster, one master
// has lost the scripts (as a replica promoted before it got them would).
// RunPipelined reloads them and runs again only the command that failed:
// the other shard's seq_alloc, which already ran, does not run twice.
// Load and Loaded cover every master and replica.
func TestRunPipelinedNoScriptOnOneClusterNode(t *testing.T) {
	rc := testenv.StartRedisCluster(t)
	rdb := rc.Client()
	ctx := context.Background()
	if err := scripts.Load(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	if ok, err := scripts.Loaded(ctx, rdb); err != nil || !ok {
		t.Fatalf("Loaded after Load: %v %v", ok, err)
	}
	k1 := "sc:seq:{a}"
	m1, r1 := rc.MasterFor(k1)
	var k2, m2 string
	for i := 0; m2 == "" || m2 == m1; i++ {
		k2 = fmt.Sprintf("sc:seq:{b%d}", i)
		m2, _ = rc.MasterFor(k2)
	}
	for _, k := range []string{k1, k2} {
		if err := rdb.Set(ctx, k, 0, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if v1, v2 := allocBoth(t, rdb, k1, k2); v1 != 1 || v2 != 1 {
		t.Fatalf("counters %d, %d after one allocation each", v1, v2)
	}

	flush := func(addr string) {
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	flush(m2)
	if v1, v2 := allocBoth(t, rdb, k1, k2); v1 != 2 || v2 != 2 {
		t.Fatalf("counters %d, %d after a NOSCRIPT on %s: a seq_alloc ran twice or not at all", v1, v2, m2)
	}

	// A replica without the scripts: Loaded notices, Load fixes it.
	flush(r1[0])
	if ok, err := scripts.Loaded(ctx, rdb); err != nil || ok {
		t.Fatalf("Loaded with a replica missing the scripts: %v %v", ok, err)
	}
	if err := scripts.Load(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	if ok, err := scripts.Loaded(ctx, rdb); err != nil || !ok {
		t.Fatalf("Loaded after reloading: %v %v", ok, err)
	}
}

// TestRunPipelinedNoScript: a Redis that lost its scripts (restarted)
// answers NOSCRIPT in a pipeline; RunPipelined reloads and runs each
// command once.
func TestRunPipelinedNoScript(t *testing.T) {
	rs := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.MSet(ctx, "seq:{a}", 0, "seq:{b}", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if v1, v2 := allocBoth(t, rdb, "seq:{a}", "seq:{b}"); v1 != 1 || v2 != 1 {
		t.Fatalf("counters %d, %d after one allocation each", v1, v2)
	}
	if ok, err := scripts.Loaded(ctx, rdb); err != nil || !ok {
		t.Fatalf("Loaded after the reload: %v %v", ok, err)
	}
}

// only is the one element of a one-key script's array reply.
func only(vs []int64, err error) (int64, error) {
	if err == nil && len(vs) != 1 {
		err = fmt.Errorf("%d replies for one key", len(vs))
	}
	if err != nil {
		return 0, err
	}
	return vs[0], nil
}

// runManyCases checks RunMany with seq_alloc and hash_max on rdb: a lost
// counter answers -1 while the others allocate; a hash named twice merges
// both fields; values never go down; the TTL is set.
func runManyCases(t *testing.T, rdb redis.UniversalClient, p string) {
	t.Helper()
	ctx := context.Background()
	if err := scripts.Load(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{p + "seq:{a}", p + "seq:{c}"} {
		if err := rdb.Set(ctx, k, 10, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	keys := []string{p + "seq:{a}", p + "seq:{b}", p + "seq:{c}"}
	vals, errs := scripts.RunMany(ctx, rdb, scripts.SeqAlloc, keys, nil, 1, []any{3, 1, 1})
	if fmt.Sprint(vals, errs) != "[13 -1 11] [<nil> <nil> <nil>]" {
		t.Fatalf("seq_alloc over a, b (lost), c: %v %v", vals, errs)
	}
	if n, _ := rdb.Exists(ctx, p+"seq:{b}").Result(); n != 0 {
		t.Fatal("seq_alloc created a lost counter")
	}

	// A key of the wrong type fails alone: the keys before and after it
	// still allocate, once.
	bad := p + "seq:{bad}"
	if err := rdb.HSet(ctx, bad, "not", "a counter").Err(); err != nil {
		t.Fatal(err)
	}
	vals, errs = scripts.RunMany(ctx, rdb, scripts.SeqAlloc, []string{p + "seq:{a}", bad, p + "seq:{c}"}, nil, 1, []any{1, 1, 1})
	if fmt.Sprint(vals[0], vals[2]) != "14 12" || errs[0] != nil || errs[2] != nil || errs[1] == nil || !strings.Contains(errs[1].Error(), "WRONGTYPE") {
		t.Fatalf("seq_alloc over a, a hash, c: %v %v", vals, errs)
	}

	u1, u2 := p+"cur:{u1}", p+"cur:{u2}"
	vals, errs = scripts.RunMany(ctx, rdb, scripts.HashMax, []string{u1, u2, u1}, []any{60}, 2, []any{"x", 5, "x", 7, "y", 2})
	if fmt.Sprint(vals, errs) != "[5 7 2] [<nil> <nil> <nil>]" {
		t.Fatalf("hash_max: %v %v", vals, errs)
	}
	vals, errs = scripts.RunMany(ctx, rdb, scripts.HashMax, []string{u1, u1}, []any{0}, 2, []any{"x", 4, "y", 9})
	if fmt.Sprint(vals, errs) != "[5 9] [<nil> <nil>]" {
		t.Fatalf("hash_max with a lower value: %v %v", vals, errs)
	}
	vals, errs = scripts.RunMany(ctx, rdb, scripts.HashMax, []string{u1, p + "seq:{a}", u2}, []any{0}, 2, []any{"y", 10, "x", 1, "x", 8})
	if fmt.Sprint(vals[0], vals[2]) != "10 8" || errs[0] != nil || errs[2] != nil || errs[1] == nil || !strings.Contains(errs[1].Error(), "WRONGTYPE") {
		t.Fatalf("hash_max over u1, a counter, u2: %v %v", vals, errs)
	}
	if h, _ := rdb.HGetAll(ctx, u1).Result(); fmt.Sprint(h) != "map[x:5 y:10]" {
		t.Fatalf("hash %s holds %v", u1, h)
	}
	if ttl, _ := rdb.TTL(ctx, u2).Result(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("ttl of %s: %v", u2, ttl)
	}
	if vals, errs := scripts.RunMany(ctx, rdb, scripts.HashMax, nil, []any{0}, 2, nil); len(vals) != 0 || len(errs) != 0 {
		t.Fatalf("no keys: %v %v", vals, errs)
	}
}

// TestRunMany: on a single Redis all keys go in one call.
func TestRunMany(t *testing.T) {
	rs := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rdb.Close()
	runManyCases(t, rdb, "rm:")
}

// TestRunManyCluster: on Redis Cluster the keys of one RunMany live in
// different slots, so each key gets its own call.
func TestRunManyCluster(t *testing.T) {
	rc := testenv.StartRedisCluster(t)
	runManyCases(t, rc.Client(), "rm:")
}

// TestReceiptGate: the first read of a window is sent at once; reads
// asked about while it is open wait, the newest kept as pending; once it
// closed, whoever asks first sends the newest (even asking about an older
// one), and the others find it sent. A read not above the last one sent
// is never sent.
func TestReceiptGate(t *testing.T) {
	rs := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	const window = 300 // ms
	keys := []string{"rcpt:{g}:ben", "rcpt:{g}:ben:last", "rcpt:{g}:ben:pending"}
	ask := func(read int64) int64 {
		t.Helper()
		v, err := scripts.ReceiptGate.Run(ctx, rdb, keys, read, window, 60).Int64()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := ask(5); v != 5 {
		t.Fatalf("first read of a window: %d, want 5 (send)", v)
	}
	if v := ask(4); v != 0 {
		t.Fatalf("a read below the one sent: %d, want 0", v)
	}
	if v := ask(7); v >= 0 || v < -window {
		t.Fatalf("a read while the window is open: %d, want to wait", v)
	}
	if v := ask(6); v >= 0 {
		t.Fatalf("an older read while the window is open: %d, want to wait", v)
	}
	time.Sleep(window*time.Millisecond + 50*time.Millisecond)
	if v := ask(6); v != 7 {
		t.Fatalf("asking about 6 after the window: %d, want the pending 7 sent", v)
	}
	if v := ask(7); v != 0 {
		t.Fatalf("asking about 7 once 7 was sent: %d, want 0", v)
	}
	if n, err := rdb.Exists(ctx, keys[2]).Result(); err != nil || n != 0 {
		t.Fatalf("pending kept after it was sent: %d %v", n, err)
	}
	if last, err := rdb.Get(ctx, keys[1]).Int64(); err != nil || last != 7 {
		t.Fatalf("last sent %d %v, want 7", last, err)
	}
}
