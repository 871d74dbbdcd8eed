// Package scripts holds Parley's Redis Lua scripts (one .lua file each,
// headed by its KEYS and ARGV), embedded and wrapped once. Load preloads
// them at start-up (on every node of a cluster). Script.Run falls back to
// EVAL on NOSCRIPT by itself, but not inside a pipeline (go-redis issue
// #3228): RunPipelined reloads the scripts and retries.
//
// Every key one script call touches shares one hash tag, so the scripts
// run unchanged on Redis Cluster. seq_alloc and hash_max take any number
// of keys: RunMany sends all of them in one call on a single Redis (one
// script invocation and one command instead of one per key, which saves
// Redis CPU per send: BENCHMARKS.md, the row "d058d7f against 41b782c"),
// and one call per key on a cluster.
package scripts

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed seq_alloc.lua
	seqAllocSrc string
	//go:embed seq_floor.lua
	seqFloorSrc string
	//go:embed hash_max.lua
	hashMaxSrc string
	//go:embed route_set.lua
	routeSetSrc string
	//go:embed route_del.lua
	routeDelSrc string
	//go:embed notify_put.lua
	notifyPutSrc string
	//go:embed notify_claim.lua
	notifyClaimSrc string
	//go:embed notify_done.lua
	notifyDoneSrc string
	//go:embed notify_gate.lua
	notifyGateSrc string
	//go:embed notify_fence.lua
	notifyFenceSrc string
	//go:embed receipt_gate.lua
	receiptGateSrc string
)

// The scripts.
var (
	SeqAlloc = redis.NewScript(seqAllocSrc)
	SeqFloor = redis.NewScript(seqFloorSrc)
	HashMax  = redis.NewScript(hashMaxSrc)
	RouteSet = redis.NewScript(routeSetSrc)
	RouteDel = redis.NewScript(routeDelSrc)
	// The notification queue (package notify).
	NotifyPut   = redis.NewScript(notifyPutSrc)
	NotifyClaim = redis.NewScript(notifyClaimSrc)
	NotifyDone  = redis.NewScript(notifyDoneSrc)
	// A device's notification gate: sends enter it, withdrawals of the
	// device's address move its fence and wait for the sends in flight.
	NotifyGate  = redis.NewScript(notifyGateSrc)
	NotifyFence = redis.NewScript(notifyFenceSrc)
	// ReceiptGate coalesces read receipts per (conversation, user).
	ReceiptGate = redis.NewScript(receiptGateSrc)
)

var all = []*redis.Script{SeqAlloc, SeqFloor, HashMax, RouteSet, RouteDel, NotifyPut, NotifyClaim, NotifyDone, NotifyGate, NotifyFence, ReceiptGate}

// Load loads every script into Redis. On a cluster it loads them into
// every master (it fails if one cannot be reached: EVALSHA goes there) and,
// best effort, into every replica, so that a replica promoted by a failover
// has them already (scripts are not replicated; one that lacks them anyway
// answers NOSCRIPT, which Script.Run and RunPipelined handle).
func Load(ctx context.Context, rdb redis.UniversalClient) error {
	load := func(ctx context.Context, c redis.Scripter) error {
		for _, s := range all {
			if err := s.Load(ctx, c).Err(); err != nil {
				return err
			}
		}
		return nil
	}
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return load(ctx, rdb)
	}
	if err := cc.ForEachMaster(ctx, func(ctx context.Context, shard *redis.Client) error {
		return load(ctx, shard)
	}); err != nil {
		return err
	}
	// A replica that is down (and not yet marked failed) must not fail
	// the load, nor the pipeline retry that depends on it.
	_ = cc.ForEachSlave(ctx, func(ctx context.Context, shard *redis.Client) error {
		return load(ctx, shard)
	})
	return nil
}

// IsNoScript reports whether err is Redis's NOSCRIPT.
func IsNoScript(err error) bool {
	return redis.HasErrorPrefix(err, "NOSCRIPT")
}

// RunPipelined runs queue (which adds EvalSha calls and other commands to
// the pipeline) and executes it; if some commands failed with NOSCRIPT it
// reloads the scripts and runs those commands once more, and only those:
// on a cluster one node may lack the scripts (a replica promoted before it
// got them) while the others ran theirs, and a script such as seq_alloc
// must not run twice. It returns the pipeline's commands and the first
// error among them.
func RunPipelined(ctx context.Context, rdb redis.UniversalClient, queue func(redis.Pipeliner)) ([]redis.Cmder, error) {
	cmds, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error { queue(p); return nil })
	var again []redis.Cmder
	for _, c := range cmds {
		if IsNoScript(c.Err()) {
			again = append(again, c)
		}
	}
	if len(again) == 0 {
		return cmds, err
	}
	// Even if a node cannot be reached, the ones that answered have them.
	lerr := Load(ctx, rdb)
	_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, c := range again {
			_ = p.Process(ctx, c)
		}
		return nil
	})
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			if lerr != nil && IsNoScript(err) {
				return cmds, errors.Join(err, lerr)
			}
			return cmds, err
		}
	}
	return cmds, nil
}

// RunMany runs s, a script over KEYS[1..k] whose ARGV is shared followed
// by per arguments for each key in turn (args holds them, len(keys)*per)
// and whose reply is an array with an element per key. On a single Redis
// all keys go in one call; on Redis Cluster, where one call may only touch
// keys of one hash slot, each key gets a call of its own, pipelined (keys
// of one slot could share one, but a conversation's and a user's keys
// rarely meet in a slot). It returns each key's element and error (the
// call's, or the key's own error reply inside the array).
func RunMany(ctx context.Context, rdb redis.UniversalClient, s *redis.Script, keys []string, shared []any, per int, args []any) ([]any, []error) {
	vals := make([]any, len(keys))
	errs := make([]error, len(keys))
	span := len(keys)
	if _, cluster := rdb.(*redis.ClusterClient); cluster {
		span = 1
	}
	type call struct {
		from, to int
		cmd      *redis.Cmd
	}
	var calls []call
	_, _ = RunPipelined(ctx, rdb, func(p redis.Pipeliner) {
		for from := 0; from < len(keys); from += span {
			to := min(from+span, len(keys))
			argv := append(append(make([]any, 0, len(shared)+(to-from)*per), shared...), args[from*per:to*per]...)
			calls = append(calls, call{from, to, s.EvalSha(ctx, p, keys[from:to], argv...)})
		}
	})
	for _, c := range calls {
		res, err := c.cmd.Slice()
		if err == nil && len(res) != c.to-c.from {
			err = fmt.Errorf("scripts: %d replies for %d keys", len(res), c.to-c.from)
		}
		for i := c.from; i < c.to; i++ {
			if err != nil {
				errs[i] = err
				continue
			}
			// A key that failed inside the script has its error reply in
			// its place.
			if e, ok := res[i-c.from].(error); ok {
				errs[i] = e
			} else {
				vals[i] = res[i-c.from]
			}
		}
	}
	return vals, errs
}

// Loaded reports whether every script is loaded in Redis: on a cluster,
// in every master, and in every replica that answers.
func Loaded(ctx context.Context, rdb redis.UniversalClient) (bool, error) {
	shas := make([]string, len(all))
	for i, s := range all {
		shas[i] = s.Hash()
	}
	loaded := func(ctx context.Context, c redis.Scripter) (bool, error) {
		ok, err := c.ScriptExists(ctx, shas...).Result()
		if err != nil {
			return false, err
		}
		for _, b := range ok {
			if !b {
				return false, nil
			}
		}
		return true, nil
	}
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return loaded(ctx, rdb)
	}
	var missing atomic.Bool
	check := func(ignoreErr bool) func(context.Context, *redis.Client) error {
		return func(ctx context.Context, shard *redis.Client) error {
			ok, err := loaded(ctx, shard)
			if err != nil {
				if ignoreErr {
					return nil
				}
				return err
			}
			if !ok {
				missing.Store(true)
			}
			return nil
		}
	}
	if err := cc.ForEachMaster(ctx, check(false)); err != nil {
		return false, err
	}
	_ = cc.ForEachSlave(ctx, check(true))
	return !missing.Load(), nil
}
