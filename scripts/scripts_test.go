package scripts_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/internal/testenv"
	"github.com/parley-im/parley/scripts"
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
	r1, err1 := c1.Int64()
	r2, err2 := c2.Int64()
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
