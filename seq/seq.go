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

// FloorFunc returns the highest seq committed for conv in the
// authoritative store (0 for an empty conversation), or an error such as
// "no such conversation".
type FloorFunc func(ctx context.Context, conv string) (int64, error)

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
		if last < 0 { // counter missing: re-seed from PostgreSQL, then allocate
			if last, errs[i] = a.allocAfterReseed(ctx, convs[i], ns[i]); errs[i] != nil {
				continue
			}
		}
		first[i] = last - ns[i] + 1
	}
	return first, errs
}

// allocAfterReseed re-seeds conv's lost counter and allocates n seqs.
func (a *Allocator) allocAfterReseed(ctx context.Context, conv string, n int64) (int64, error) {
	if err := a.Reseed(ctx, conv); err != nil {
		return 0, err
	}
	lasts, err := scripts.SeqAlloc.Run(ctx, a.rdb, []string{a.Key(conv)}, n).Int64Slice()
	switch {
	case err != nil:
		return 0, fmt.Errorf("seq: %w", err)
	case len(lasts) != 1:
		return 0, fmt.Errorf("seq: seq_alloc replied %v", lasts)
	case lasts[0] < 0:
		return 0, errors.New("seq: counter vanished while re-seeding")
	}
	return lasts[0], nil
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
	floor, err := a.floor(ctx, conv)
	if err != nil {
		return err
	}
	if err := scripts.SeqFloor.Run(ctx, a.rdb, []string{a.Key(conv)}, floor).Err(); err != nil {
		return fmt.Errorf("seq: %w", err)
	}
	return nil
}
