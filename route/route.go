// Package route is the routing table in Redis: which gateway holds the
// connection of each online device. Entries live in one hash per user
// ({user}-tagged), written by the route_set script with a fencing token,
// so a registration from an older connection or a late write from an old
// gateway never overwrites a newer one. Each gateway holds a lease
// key naming its boot id; entries of a gateway whose lease has expired (or
// that rebooted) are ignored, and reaped when seen.
package route

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/scripts"
)

// Entry is one device's route.
type Entry struct {
	User    string
	Device  string
	Token   int64
	Gateway string
	Boot    string
}

// ErrFenced means a newer connection of the device is registered already.
var ErrFenced = errors.New("route: a newer connection of the device is registered")

// Table reads and writes the routing table on behalf of one gateway.
type Table struct {
	// Static after construction.
	rdb     redis.UniversalClient
	prefix  string
	gateway string
	boot    string
	lease   time.Duration

	mu    sync.Mutex // guards alive
	alive map[string]liveness
}

type liveness struct {
	boot    string // "" if the lease is missing
	checked time.Time
}

// New returns the table as seen by gateway (booted as boot).
func New(rdb redis.UniversalClient, prefix, gateway, boot string, lease time.Duration) *Table {
	return &Table{rdb: rdb, prefix: prefix, gateway: gateway, boot: boot, lease: lease, alive: map[string]liveness{}}
}

// Gateway is this table's gateway id.
func (t *Table) Gateway() string { return t.gateway }

// Boot is this gateway's boot id.
func (t *Table) Boot() string { return t.boot }

func (t *Table) userKey(user string) string { return t.prefix + "rt:{" + user + "}" }
func (t *Table) leaseKey(gw string) string  { return t.prefix + "gw:" + gw }

// RenewLease (re)writes this gateway's lease. Call it every lease/3.
func (t *Table) RenewLease(ctx context.Context) error {
	return t.rdb.Set(ctx, t.leaseKey(t.gateway), t.boot, t.lease).Err()
}

// DropLease deletes this gateway's lease (clean shutdown).
func (t *Table) DropLease(ctx context.Context) error {
	return t.rdb.Del(ctx, t.leaseKey(t.gateway)).Err()
}

// Register records that this gateway holds device's connection. token 0
// issues a new fencing token (a new connection); a non-zero token
// re-registers an existing connection (after Redis lost the table). It
// returns the connection's token and the entry it replaced, if any, or
// ErrFenced with the newer entry.
func (t *Table) Register(ctx context.Context, user, device string, token int64) (int64, *Entry, error) {
	r := t.RegisterMany(ctx, []Registration{{User: user, Device: device, Token: token}})[0]
	return r.Token, r.Prev, r.Err
}

// Registration is one connection to register (Register's arguments).
type Registration struct {
	User, Device string
	Token        int64
}

// Registered is the outcome of one Registration, as Register returns it.
type Registered struct {
	Token int64
	Prev  *Entry
	Err   error
}

// RegisterMany registers connections as Register does, in one pipeline:
// in a reconnect storm every device registers at once, and a round trip
// each cost the gateway a write and a read system call per device. Each
// registration has its own outcome; a failed pipeline fails all of them.
func (t *Table) RegisterMany(ctx context.Context, rs []Registration) []Registered {
	val := t.gateway + "|" + t.boot
	now := time.Now().UnixMicro()
	cmds := make([]*redis.Cmd, len(rs))
	_, _ = scripts.RunPipelined(ctx, t.rdb, func(p redis.Pipeliner) {
		for i, r := range rs {
			cmds[i] = scripts.RouteSet.EvalSha(ctx, p, []string{t.userKey(r.User)}, r.Device, r.Token, val, now)
		}
	})
	out := make([]Registered, len(rs))
	for i, r := range rs {
		out[i] = registered(r, cmds[i])
	}
	return out
}

// registered reads route_set's reply to r.
func registered(r Registration, cmd *redis.Cmd) Registered {
	res, err := cmd.Slice()
	if err != nil {
		return Registered{Err: fmt.Errorf("route: %w", err)}
	}
	if len(res) != 2 {
		return Registered{Err: fmt.Errorf("route: unexpected reply %v", res)}
	}
	var out Registered
	if prev, _ := res[1].(string); prev != "" {
		if e, ok := parseEntry(r.User, r.Device, prev); ok {
			out.Prev = &e
		}
	}
	if out.Token, out.Err = toInt64(res[0]); out.Err == nil && out.Token == 0 {
		out.Err = ErrFenced
	}
	return out
}

// Unregister removes device's entry if it still belongs to token.
func (t *Table) Unregister(ctx context.Context, user, device string, token int64) error {
	return scripts.RouteDel.Run(ctx, t.rdb, []string{t.userKey(user)}, device, strconv.FormatInt(token, 10)).Err()
}

// Lookup returns the live routes of every user's devices, in one pipeline
// (plus one for gateway leases not checked in the last second).
func (t *Table) Lookup(ctx context.Context, users []string) ([]Entry, error) {
	cmds := make([]*redis.MapStringStringCmd, len(users))
	_, err := t.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, u := range users {
			cmds[i] = p.HGetAll(ctx, t.userKey(u))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("route: %w", err)
	}
	var out []Entry
	for i, c := range cmds {
		for dev, val := range c.Val() {
			if strings.HasPrefix(dev, "#") {
				continue
			}
			if e, ok := parseEntry(users[i], dev, val); ok {
				out = append(out, e)
			}
		}
	}
	return t.filterLive(ctx, out)
}

// filterLive drops entries whose gateway lease is gone or names another
// boot, and reaps them.
func (t *Table) filterLive(ctx context.Context, es []Entry) ([]Entry, error) {
	now := time.Now()
	t.mu.Lock()
	var stale []string
	seen := map[string]bool{}
	for _, e := range es {
		if e.Gateway == t.gateway || seen[e.Gateway] {
			continue
		}
		seen[e.Gateway] = true
		if l, ok := t.alive[e.Gateway]; !ok || now.Sub(l.checked) > time.Second {
			stale = append(stale, e.Gateway)
		}
	}
	t.mu.Unlock()
	if len(stale) > 0 {
		if _, err := t.readLeases(ctx, stale); err != nil {
			return nil, err
		}
	}
	live := es[:0]
	var dead []Entry
	t.mu.Lock()
	for _, e := range es {
		boot := t.boot
		if e.Gateway != t.gateway {
			boot = t.alive[e.Gateway].boot
		}
		if boot != "" && boot == e.Boot {
			live = append(live, e)
		} else {
			dead = append(dead, e)
		}
	}
	t.mu.Unlock()
	if len(dead) > 0 {
		live = append(live, t.reap(ctx, dead)...)
	}
	return live, nil
}

// readLeases reads the leases of gws (boot id, "" if gone) and caches them.
func (t *Table) readLeases(ctx context.Context, gws []string) (map[string]string, error) {
	cmds := make([]*redis.StringCmd, len(gws))
	_, err := t.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, gw := range gws {
			cmds[i] = p.Get(ctx, t.leaseKey(gw))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("route: %w", err)
	}
	// A pipeline reports only its first error: on a cluster, a missing
	// lease (redis.Nil) on one shard can hide a failed read on another.
	// A lease that could not be read must not count as gone (its
	// gateway's entries would be reaped).
	for _, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("route: %w", err)
		}
	}
	now := time.Now()
	boots := make(map[string]string, len(gws))
	t.mu.Lock()
	for i, gw := range gws {
		boots[gw] = cmds[i].Val()
		t.alive[gw] = liveness{boot: boots[gw], checked: now}
	}
	t.mu.Unlock()
	return boots, nil
}

// reap removes the routing entries of dead (each only if no newer
// connection replaced it) and returns those found alive after all. The
// leases of other gateways are read again first, not taken from the cache:
// a gateway whose lease lapsed (Redis lost it, or a failover outlasted it)
// renews it and then re-registers its connections, and a view up to a
// second old must not remove those fresh entries.
func (t *Table) reap(ctx context.Context, dead []Entry) []Entry {
	var gws []string
	seen := map[string]bool{}
	for _, e := range dead {
		if e.Gateway != t.gateway && !seen[e.Gateway] {
			seen[e.Gateway] = true
			gws = append(gws, e.Gateway)
		}
	}
	var boots map[string]string
	if len(gws) > 0 {
		var err error
		if boots, err = t.readLeases(ctx, gws); err != nil {
			return nil // reap nothing on a doubt
		}
	}
	var alive []Entry
	for _, e := range dead {
		boot := t.boot
		if e.Gateway != t.gateway {
			boot = boots[e.Gateway]
		}
		if boot != "" && boot == e.Boot {
			alive = append(alive, e)
			continue
		}
		_ = t.Unregister(ctx, e.User, e.Device, e.Token)
	}
	return alive
}

func parseEntry(user, device, val string) (Entry, bool) {
	parts := strings.SplitN(val, "|", 3)
	if len(parts) != 3 {
		return Entry{}, false
	}
	tok, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil {
		return Entry{}, false
	}
	return Entry{User: user, Device: device, Token: tok, Gateway: parts[1], Boot: parts[2]}, true
}

func toInt64(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("route: unexpected token %T", v)
}

// RenewLeaseCheck renews the lease and reports whether it had been lost
// (expired, or Redis lost its data): the gateway then re-registers its
// connections.
func (t *Table) RenewLeaseCheck(ctx context.Context) (lost bool, err error) {
	old, err := t.rdb.SetArgs(ctx, t.leaseKey(t.gateway), t.boot, redis.SetArgs{TTL: t.lease, Get: true}).Result()
	if errors.Is(err, redis.Nil) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("route: %w", err)
	}
	return old != t.boot, nil
}
