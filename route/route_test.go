package route_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/route"
	"github.com/parley-im/parley/scripts"
	"github.com/parley-im/parley/test/testenv"
)

// TestLookupOnClusterWithALeaseShardDown: on a Redis Cluster, the lease of
// a live gateway sits on a shard that is down while another gateway's
// lease is simply missing on a healthy shard. The pipeline reading the
// leases reports only its first error (the missing lease's redis.Nil), but
// the unreadable lease must not count as gone: the live gateway's routing
// entries stay.
func TestLookupOnClusterWithALeaseShardDown(t *testing.T) {
	rc := testenv.StartRedisCluster(t)
	ctx := context.Background()
	// Nobody declares the dead master failed while the test runs: the
	// other shards keep serving, and no replica takes over.
	for _, addr := range rc.Addrs() {
		c := redis.NewClient(&redis.Options{Addr: addr})
		err := c.ConfigSet(ctx, "cluster-node-timeout", "60000").Err()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	// Few retries: the lookup below fails fast.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs(), DialerRetries: 1, MaxRedirects: 1})
	defer rdb.Close()
	if err := scripts.Load(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	const prefix = "rtt:"
	master := func(key string) string { m, _ := rc.MasterFor(key); return m }
	down := master(prefix + "gw:gw-a")
	// gw-b's lease, and both users' routing hashes, on other shards.
	pick := func(format string) string {
		for i := 0; i < 100; i++ {
			name := fmt.Sprintf(format, i)
			key := prefix + "gw:" + name
			if format[0] == 'u' {
				key = prefix + "rt:{" + name + "}"
			}
			if master(key) != down {
				return name
			}
		}
		t.Fatalf("no name %q off shard %s", format, down)
		return ""
	}
	gwB, u1, u2 := pick("gw-b%d"), pick("u1-%d"), pick("u2-%d")

	a := route.New(rdb, prefix, "gw-a", "boot-a", time.Minute)
	b := route.New(rdb, prefix, gwB, "boot-b", time.Minute)
	obs := route.New(rdb, prefix, "gw-obs", "boot-o", time.Minute)
	if err := a.RenewLease(ctx); err != nil {
		t.Fatal(err)
	}
	// gw-b holds no lease (it died): its entry is dead. Listed first, so
	// the lease reads come in the order gw-b (missing), gw-a (unreadable).
	if _, _, err := b.Register(ctx, u1, "d1", 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Register(ctx, u2, "d2", 0); err != nil {
		t.Fatal(err)
	}

	rc.Kill(down)
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	es, err := obs.Lookup(lctx, []string{u1, u2})
	cancel()
	t.Logf("lookup with gw-a's lease shard down: %v, %v", es, err)
	if err == nil {
		t.Errorf("lookup succeeded although gw-a's lease could not be read: %+v", es)
	}
	if ok, err := rdb.HExists(ctx, prefix+"rt:{"+u2+"}", "d2").Result(); err != nil || !ok {
		t.Fatalf("the live gateway's entry was reaped (exists %v, %v)", ok, err)
	}
}
