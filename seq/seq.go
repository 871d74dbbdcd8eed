// Package seq allocates each conversation's sequence numbers from a Redis
// counter (INCRBY on a {conv}-tagged key, through the seq_alloc script:
// one call allocates for every conversation of a commit batch).
// A counter that Redis lost is re-seeded from the highest seq committed in
// PostgreSQL, never restarted at 1; a seq that turns out to be taken
// anyway (an in-flight send of the old counter) is caught by the store's
// unique key and the caller re-seeds and allocates again.
package seq

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/scripts"
)

// FloorFunc returns the highest seq committed for each of convs in the
// authoritative store (0 for an empty conversation), in one round trip:
// a whole batch's lost counters are re-seeded at once (after Redis lost
// its data, or for conversations created without a counter, every active
// conversation's next send needs one). errs, if not nil, holds an error
// per conversation, such as "no such conversation"; err fails them all.
type FloorFunc func(ctx context.Context, convs []string) (floors []int64, errs []error, err error)

// Allocator hands out seqs.
type Allocator struct {
	rdb    redis.UniversalClient
	prefix string
	floor  FloorFunc
}

// New returns an Allocator over rdb whose keys start with prefix.
func New(rdb redis.UniversalClient, prefix string, floor FloorFunc) *Allocator {
	return &Allocator{rdb: rdb, prefix: prefix, floor: floor}
}

// Key is the counter's key for conv.
func (a *Allocator) Key(conv string) string { return a.prefix + "seq:{" + conv + "}" }

// Alloc allocates ns[i] consecutive seqs for convs[i] (convs distinct) in
// one pipeline and returns the first seq of each range, or the first
// error of any conversation.
func (a *Allocator) Alloc(ctx context.Context, convs []string, ns []int64) ([]int64, error) {
	first, errs := a.AllocEach(ctx, convs, ns)
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return first, nil
}

// AllocEach is Alloc with an error per conversation: on Redis Cluster one
// shard can fail (a failover) while the others allocate, and those seqs
// must be used, not left as holes.
func (a *Allocator) AllocEach(ctx context.Context, convs []string, ns []int64) ([]int64, []error) {
	first := make([]int64, len(convs))
	keys := make([]string, len(convs))
	args := make([]any, len(convs))
	for i, conv := range convs {
		keys[i], args[i] = a.Key(conv), ns[i]
	}
	lasts, errs := scripts.RunMany(ctx, a.rdb, scripts.SeqAlloc, keys, nil, 1, args)
	var missing []int
	for i := range convs {
		if errs[i] != nil {
			errs[i] = fmt.Errorf("seq: %w", errs[i])
			continue
		}
		last, ok := lasts[i].(int64)
		if !ok {
			errs[i] = fmt.Errorf("seq: seq_alloc replied %v", lasts[i])
			continue
		}
		if last < 0 { // counter missing: re-seeded below, all at once
			missing = append(missing, i)
			continue
		}
		first[i] = last - ns[i] + 1
	}
	if len(missing) > 0 {
		a.allocAfterReseed(ctx, convs, ns, missing, first, errs)
	}
	return first, errs
}

// allocAfterReseed re-seeds the lost counters of convs[i] for i in
// missing and allocates ns[i] seqs of each, setting first[i] or errs[i]:
// one PostgreSQL statement and two pipelines for all of them.
func (a *Allocator) allocAfterReseed(ctx context.Context, convs []string, ns []int64, missing []int, first []int64, errs []error) {
	mconvs := make([]string, len(missing))
	for j, i := range missing {
		mconvs[j] = convs[i]
	}
	serrs := a.ReseedMany(ctx, mconvs)
	keys := make([]string, 0, len(missing))
	args := make([]any, 0, len(missing))
	var idx []int
	for j, i := range missing {
		if serrs[j] != nil {
			errs[i] = serrs[j]
			continue
		}
		keys, args, idx = append(keys, a.Key(convs[i])), append(args, ns[i]), append(idx, i)
	}
	if len(keys) == 0 {
		return
	}
	lasts, aerrs := scripts.RunMany(ctx, a.rdb, scripts.SeqAlloc, keys, nil, 1, args)
	for j, i := range idx {
		last, ok := lasts[j].(int64)
		switch {
		case aerrs[j] != nil:
			errs[i] = fmt.Errorf("seq: %w", aerrs[j])
		case !ok:
			errs[i] = fmt.Errorf("seq: seq_alloc replied %v", lasts[j])
		case last < 0:
			errs[i] = errors.New("seq: counter vanished while re-seeding")
		default:
			first[i] = last - ns[i] + 1
		}
	}
}

// AllocOne allocates one seq of conv.
func (a *Allocator) AllocOne(ctx context.Context, conv string) (int64, error) {
	s, err := a.Alloc(ctx, []string{conv}, []int64{1})
	if err != nil {
		return 0, err
	}
	return s[0], nil
}

// Reseed raises conv's counter to at least the highest committed seq.
func (a *Allocator) Reseed(ctx context.Context, conv string) error {
	return a.ReseedMany(ctx, []string{conv})[0]
}

// ReseedMany raises the counters of convs (distinct) to at least their
// highest committed seqs: one statement and one pipeline for all. It
// returns each one's error (nil: re-seeded).
func (a *Allocator) ReseedMany(ctx context.Context, convs []string) []error {
	errs := make([]error, len(convs))
	floors, ferrs, err := a.floor(ctx, convs)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	cmds := make([]*redis.Cmd, len(convs))
	_, _ = scripts.RunPipelined(ctx, a.rdb, func(p redis.Pipeliner) {
		for i, conv := range convs {
			if ferrs == nil || ferrs[i] == nil {
				cmds[i] = scripts.SeqFloor.EvalSha(ctx, p, []string{a.Key(conv)}, floors[i])
			}
		}
	})
	for i, c := range cmds {
		switch {
		case c == nil:
			errs[i] = ferrs[i]
		case c.Err() != nil:
			errs[i] = fmt.Errorf("seq: %w", c.Err())
		}
	}
	return errs
}
