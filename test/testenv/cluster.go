package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterNodes is how many redis-server processes StartRedisCluster runs:
// three masters, each with one replica.
const ClusterNodes = 6

// clusterTimeout bounds each wait of the cluster helpers (start-up,
// cluster creation, a failover).
const clusterTimeout = 30 * time.Second

// RedisCluster is a private Redis Cluster owned by one test: six
// redis-server processes on free ports of 127.0.0.1 (three masters, three
// replicas), without persistence, their files in a t.TempDir. Its methods
// call t.Fatal on failure, so call them from the test's goroutine.
type RedisCluster struct {
	t     testing.TB
	bin   string
	cli   string
	dir   string
	nodes []*clusterNode

	mu      sync.Mutex
	clients []*redis.ClusterClient
}

// clusterNode is one redis-server of the cluster.
type clusterNode struct {
	port int
	log  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

func (n *clusterNode) addr() string { return fmt.Sprintf("127.0.0.1:%d", n.port) }

// StartRedisCluster starts six cluster-enabled redis-servers
// (--cluster-node-timeout 2000, so a dead master's replica takes over within
// a few seconds), joins them with `redis-cli --cluster create
// --cluster-replicas 1`, and waits until every node reports
// cluster_state:ok, knows all six nodes, and every replica's link to its
// master is up. A t.Cleanup kills every process. It fails the test (never
// skips) if redis-server or redis-cli is missing.
func StartRedisCluster(t testing.TB) *RedisCluster {
	t.Helper()
	bin := findBinary(t, "redis-server")
	cli := findBinary(t, "redis-cli")
	c := &RedisCluster{t: t, bin: bin, cli: cli, dir: t.TempDir()}
	t.Cleanup(func() {
		c.mu.Lock()
		for _, cc := range c.clients {
			cc.Close()
		}
		c.mu.Unlock()
		for _, n := range c.nodes {
			n.stop()
		}
		if t.Failed() {
			for _, n := range c.nodes {
				t.Logf("testenv: cluster node %s, end of its log:\n%s", n.addr(), tail(n.log, 15))
			}
		}
	})

	// Start the six processes at once; each retries on another port if its
	// port (or its bus port, port+10000) was taken meanwhile.
	c.nodes = make([]*clusterNode, ClusterNodes)
	errs := make([]error, ClusterNodes)
	used := map[int]bool{}
	var wg sync.WaitGroup
	for i := range c.nodes {
		n := &clusterNode{}
		c.nodes[i] = n
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				if errs[i] = c.startNode(n, used); errs[i] == nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("testenv: starting the cluster's redis-servers: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("testenv: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if err := c.waitHealthy(ctx, health{replicas: true}); err != nil {
		t.Fatalf("testenv: the new Redis Cluster did not become healthy within %v: %v", clusterTimeout, err)
	}
	return c
}

// findBinary looks name up on PATH and in /usr/bin.
func findBinary(t testing.TB, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	p := "/usr/bin/" + name
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("testenv: %s is not installed (not on PATH, not in /usr/bin); "+
			"`make services` installs it (Debian package redis-server)", name)
	}
	return p
}

var clusterPortMu sync.Mutex

// freeClusterPort returns a free port whose bus port (port+10000) is free
// too, and that no other node of this cluster has picked.
func freeClusterPort(t testing.TB, used map[int]bool) (int, error) {
	clusterPortMu.Lock()
	defer clusterPortMu.Unlock()
	for range 100 {
		p := FreePort(t)
		if used[p] || used[p+10000] || used[p-10000] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+10000))
		if err != nil {
			continue
		}
		l.Close()
		used[p] = true
		return p, nil
	}
	return 0, errors.New("no free port pair (port, port+10000) found")
}

// startNode picks ports for n and starts it.
func (c *RedisCluster) startNode(n *clusterNode, used map[int]bool) error {
	port, err := freeClusterPort(c.t, used)
	if err != nil {
		return err
	}
	n.port = port
	n.log = filepath.Join(c.dir, fmt.Sprintf("redis-%d.log", port))
	return c.start(n)
}

// start launches n on its port and waits until it answers PING. Its
// cluster config file (node id, epochs, peers) survives a restart; its
// data and script cache do not.
func (c *RedisCluster) start(n *clusterNode) error {
	// A replica's full sync leaves an RDB file behind: a restart must not
	// load it.
	dump := fmt.Sprintf("dump-%d.rdb", n.port)
	os.Remove(filepath.Join(c.dir, dump))
	port := n.port
	cmd := exec.Command(c.bin,
		"--cluster-enabled", "yes",
		"--port", strconv.Itoa(port),
		"--cluster-config-file", filepath.Join(c.dir, fmt.Sprintf("nodes-%d.conf", port)),
		"--dir", c.dir,
		"--dbfilename", dump,
		"--save", "",
		"--appendonly", "no",
		"--cluster-node-timeout", "2000",
		"--bind", "127.0.0.1",
		// Replicas sync at once (the default waits 5 s for more replicas).
		"--repl-diskless-sync-delay", "0",
		// Replicas' offsets move (and CLUSTER SLOTS lists them) within a
		// second even with no writes (the default pings every 10 s).
		"--repl-ping-replica-period", "1",
		"--daemonize", "no",
		"--logfile", "", // stdout, which is the log file
	)
	cmd.Dir = c.dir
	setDeathSignal(cmd)
	done, err := launch(cmd, n.log)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.cmd, n.done = cmd, done
	n.mu.Unlock()
	err = waitReady(fmt.Sprintf("cluster node on port %d", port), cmd, done, n.log, func() error { return ping(n.addr()) })
	if err != nil {
		if _, exited := err.(errExited); !exited {
			n.stop()
		}
		return err
	}
	return nil
}

// stop kills the process (SIGKILL) if it runs and waits for it to exit.
func (n *clusterNode) stop() {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.cmd, n.done = nil, nil
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-done
}

func (n *clusterNode) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil
}

// Addrs returns the addresses (127.0.0.1:PORT) of all six nodes, running or not.
func (c *RedisCluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.addr()
	}
	return out
}

// Seeds returns the nodes' addresses comma-separated, the form of the
// redis_cluster setting.
func (c *RedisCluster) Seeds() string { return strings.Join(c.Addrs(), ",") }

// Client returns a new go-redis cluster client of the cluster, closed at
// the test's cleanup.
func (c *RedisCluster) Client() *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ClusterStateReloadInterval: time.Second})
	c.mu.Lock()
	c.clients = append(c.clients, cc)
	c.mu.Unlock()
	return cc
}

// nodeClient is a client of one node that neither retries nor waits long.
func nodeClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: 2 * time.Second,
		MaxRetries: -1, DialerRetries: 1, PoolSize: 1})
}

func (c *RedisCluster) live() []*clusterNode {
	var out []*clusterNode
	for _, n := range c.nodes {
		if n.running() {
			out = append(out, n)
		}
	}
	return out
}

func (c *RedisCluster) node(addr string) *clusterNode {
	for _, n := range c.nodes {
		if n.addr() == addr {
			return n
		}
	}
	return nil
}

// slotOwners asks the node at addr which master and replicas serve slot.
func slotOwners(ctx context.Context, addr string, slot int) (master string, replicas []string, err error) {
	rc := nodeClient(addr)
	defer rc.Close()
	slots, err := rc.ClusterSlots(ctx).Result()
	if err != nil {
		return "", nil, err
	}
	for _, s := range slots {
		if slot < s.Start || slot > s.End || len(s.Nodes) == 0 {
			continue
		}
		for _, n := range s.Nodes[1:] {
			replicas = append(replicas, n.Addr)
		}
		return s.Nodes[0].Addr, replicas, nil
	}
	return "", nil, fmt.Errorf("%s: slot %d is not served", addr, slot)
}

// Slot is the hash slot of key (computed by the cluster).
func (c *RedisCluster) Slot(key string) int {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	for _, n := range c.live() {
		rc := nodeClient(n.addr())
		s, err := rc.ClusterKeySlot(ctx, key).Result()
		rc.Close()
		if err == nil {
			return int(s)
		}
	}
	c.t.Fatalf("testenv: no cluster node answers CLUSTER KEYSLOT")
	return 0
}

// MasterFor returns the address of the master serving key, and of its
// replicas, as the first live node that answers sees them.
func (c *RedisCluster) MasterFor(key string) (master string, replicas []string) {
	c.t.Helper()
	slot := c.Slot(key)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	var lastErr error
	for _, n := range c.live() {
		m, r, err := slotOwners(ctx, n.addr(), slot)
		if err == nil {
			return m, r
		}
		lastErr = err
	}
	c.t.Fatalf("testenv: finding the master of %q: %v", key, lastErr)
	return "", nil
}

// Failover makes a replica of key's master take over with a manual
// CLUSTER FAILOVER (the master hands over once the replica has caught up,
// so no write is lost), and waits until every node sees the replica as the
// slot's master and the cluster is healthy. It returns the old and the new
// master.
func (c *RedisCluster) Failover(key string) (oldMaster, newMaster string) {
	c.t.Helper()
	oldMaster, replicas := c.MasterFor(key)
	if len(replicas) == 0 {
		c.t.Fatalf("testenv: the master %s of %q has no replica", oldMaster, key)
	}
	newMaster = replicas[0]
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	rc := nodeClient(newMaster)
	defer rc.Close()
	if err := rc.ClusterFailover(ctx).Err(); err != nil {
		c.t.Fatalf("testenv: CLUSTER FAILOVER on %s: %v", newMaster, err)
	}
	if err := c.waitHealthy(ctx, health{replicas: true, key: key, master: newMaster}); err != nil {
		c.t.Fatalf("testenv: failover of %q from %s to %s: %v", key, oldMaster, newMaster, err)
	}
	return oldMaster, newMaster
}

// KillMasterFor SIGKILLs the master serving key and waits until one of its
// replicas has taken over (elected by the other masters once the node
// timeout, 2 s, has passed) and every live node reports cluster_state:ok.
// Writes the dead master acknowledged but had not yet sent to its replica
// are lost, as in a real crash. It returns the killed and the new master.
func (c *RedisCluster) KillMasterFor(key string) (killed, newMaster string) {
	c.t.Helper()
	killed, replicas := c.MasterFor(key)
	if len(replicas) == 0 {
		c.t.Fatalf("testenv: the master %s of %q has no replica", killed, key)
	}
	c.node(killed).stop()
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if err := c.waitHealthy(ctx, health{key: key}); err != nil {
		c.t.Fatalf("testenv: no replica of %s took over %q: %v", killed, key, err)
	}
	newMaster, _ = c.MasterFor(key)
	return killed, newMaster
}

// Restart starts the killed node at addr again, empty (no data, no
// scripts), and waits until it has rejoined as a replica, synced, and the
// cluster is healthy with a replica for every master.
func (c *RedisCluster) Restart(addr string) {
	c.t.Helper()
	n := c.node(addr)
	if n == nil {
		c.t.Fatalf("testenv: no cluster node %s", addr)
	}
	n.stop()
	if err := c.start(n); err != nil {
		c.t.Fatalf("testenv: restarting cluster node %s: %v", addr, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if err := c.waitHealthy(ctx, health{replicas: true}); err != nil {
		c.t.Fatalf("testenv: cluster node %s restarted, but the cluster is not healthy within %v: %v", addr, clusterTimeout, err)
	}
}

// Kill SIGKILLs the node at addr (no wait for a failover).
func (c *RedisCluster) Kill(addr string) {
	c.t.Helper()
	n := c.node(addr)
	if n == nil {
		c.t.Fatalf("testenv: no cluster node %s", addr)
	}
	n.stop()
}

// health is what waitHealthy waits for besides cluster_state:ok.
type health struct {
	replicas bool   // every slot's master has a live replica (in CLUSTER SLOTS)
	key      string // if set: every node names master (or any live node) for key's slot
	master   string
}

// waitHealthy waits (bounded by ctx) until every live node reports
// cluster_state:ok, knows all six nodes, sees every slot served by a live
// master and no live node failing, every live replica's link to its master
// is up, and what want asks for holds on every live node.
func (c *RedisCluster) waitHealthy(ctx context.Context, want health) error {
	slot := -1
	if want.key != "" {
		slot = c.Slot(want.key)
	}
	for {
		err := c.healthy(ctx, want, slot)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *RedisCluster) healthy(ctx context.Context, want health, slot int) error {
	live := c.live()
	liveAddr := map[string]bool{}
	for _, n := range live {
		liveAddr[n.addr()] = true
	}
	for _, n := range live {
		rc := nodeClient(n.addr())
		err := func() error {
			info, err := rc.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") ||
				!strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", len(c.nodes))) {
				return fmt.Errorf("%s: cluster info: %s", n.addr(), strings.Join(strings.Fields(info), " "))
			}
			nodes, err := rc.ClusterNodes(ctx).Result()
			if err != nil {
				return err
			}
			for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
				f := strings.Fields(line)
				if len(f) < 3 {
					continue
				}
				addr, _, _ := strings.Cut(f[1], "@")
				if liveAddr[addr] && strings.Contains(f[2], "fail") {
					return fmt.Errorf("%s sees live node %s as %s", n.addr(), addr, f[2])
				}
			}
			repl, err := rc.Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			if strings.Contains(repl, "role:slave") {
				if m := field(repl, "master_host") + ":" + field(repl, "master_port"); !liveAddr[m] {
					return fmt.Errorf("%s replicates %s, which is dead", n.addr(), m)
				}
				if !strings.Contains(repl, "master_link_status:up") {
					return fmt.Errorf("%s: the replica's link to its master is not up", n.addr())
				}
			}
			slots, err := rc.ClusterSlots(ctx).Result()
			if err != nil {
				return err
			}
			covered := 0
			for _, s := range slots {
				if len(s.Nodes) == 0 || !liveAddr[s.Nodes[0].Addr] {
					return fmt.Errorf("%s: slots %d-%d served by %v", n.addr(), s.Start, s.End, s.Nodes)
				}
				if want.replicas && (len(s.Nodes) < 2 || !liveAddr[s.Nodes[1].Addr]) {
					return fmt.Errorf("%s: slots %d-%d have no live replica: %v", n.addr(), s.Start, s.End, s.Nodes)
				}
				if slot >= s.Start && slot <= s.End && want.master != "" && s.Nodes[0].Addr != want.master {
					return fmt.Errorf("%s names %s as master of %q, want %s", n.addr(), s.Nodes[0].Addr, want.key, want.master)
				}
				covered += s.End - s.Start + 1
			}
			if covered != 16384 {
				return fmt.Errorf("%s: %d slots served", n.addr(), covered)
			}
			return nil
		}()
		rc.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// field returns the value of "name:value" in an INFO reply.
func field(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// EnvRedisCluster names the variable that points the server tests at a
// shared Redis Cluster: comma-separated host:port seeds (the form of the
// redis_cluster setting). `make test-cluster` sets it.
const EnvRedisCluster = "PARLEY_TEST_REDIS_CLUSTER"

// RedisClusterSeeds returns the seeds of the shared test Redis Cluster
// (PARLEY_TEST_REDIS_CLUSTER), or "" when the variable is unset. It fails
// the test if the cluster does not answer or is not healthy, and registers
// a t.Cleanup that deletes every key starting with prefix on every master.
func RedisClusterSeeds(t testing.TB, prefix string) string {
	t.Helper()
	seeds := os.Getenv(EnvRedisCluster)
	if seeds == "" {
		return ""
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(seeds, ","), DialerRetries: 1, MaxRetries: -1})
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	info, err := cc.ClusterInfo(ctx).Result()
	if err == nil && !strings.Contains(info, "cluster_state:ok") {
		err = fmt.Errorf("cluster_state is not ok: %s", strings.Join(strings.Fields(info), " "))
	}
	if err != nil {
		cc.Close()
		t.Fatalf("testenv: the test Redis Cluster at %s (%s): %v", seeds, EnvRedisCluster, err)
	}
	t.Cleanup(func() {
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		if err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return deletePrefix(ctx, m, prefix)
		}); err != nil {
			t.Errorf("testenv: deleting Redis Cluster keys %s*: %v", prefix, err)
		}
	})
	return seeds
}
