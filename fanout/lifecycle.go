package fanout

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/vmihailenco/msgpack/v5"
)

// Lifecycle is an admin change to a device or user that live connections
// must obey: Device's connections close (revoked, token rotated), or
// User's connections close (suspended), or User may authenticate again
// (Reason "unsuspended").
type Lifecycle struct {
	Device string `msgpack:"d,omitempty"`
	User   string `msgpack:"u,omitempty"`
	Reason string `msgpack:"r"` // "revoked", "suspended", "unsuspended"
}

// Lifecycle notices travel on a Redis stream that every gateway reads
// with a blocking XREAD, rather than on the pub/sub bus: a gateway that
// loses its Redis connection for a moment resumes after the last notice it
// read, so it never misses one, and a notice reaches every gateway within
// milliseconds of the admin call.
const (
	lifecycleMaxLen = 100000                 // notices kept (approximately)
	lifecycleBlock  = 500 * time.Millisecond // one XREAD waits this long at most
	lifecycleRetry  = 100 * time.Millisecond // after a failed XREAD
)

func (b *Bus) lifecycleKey() string { return b.prefix + "lifecycle" }

// Lifecycle announces a device or user lifecycle change to every gateway.
func (b *Bus) Lifecycle(ctx context.Context, l Lifecycle) error {
	payload, err := msgpack.Marshal(l)
	if err != nil {
		return err
	}
	err = b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.lifecycleKey(), MaxLen: lifecycleMaxLen, Approx: true,
		Values: []any{"l", payload}}).Err()
	if err != nil {
		return fmt.Errorf("lifecycle: %w", err)
	}
	return nil
}

// LifecycleFrom returns the id of the newest lifecycle notice ("0-0" if
// none): FollowLifecycle from it hands over every notice announced after
// this call.
func (b *Bus) LifecycleFrom(ctx context.Context) (string, error) {
	msgs, err := b.rdb.XRevRangeN(ctx, b.lifecycleKey(), "+", "-", 1).Result()
	if err != nil {
		return "", fmt.Errorf("lifecycle: %w", err)
	}
	if len(msgs) == 0 {
		return "0-0", nil
	}
	return msgs[0].ID, nil
}

// FollowLifecycle hands every lifecycle notice after the one with id
// from to f, in order, until ctx ends; after a Redis error it tries again
// from where it was.
func (b *Bus) FollowLifecycle(ctx context.Context, from string, f func(Lifecycle)) {
	last := from
	for ctx.Err() == nil {
		res, err := b.rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{b.lifecycleKey(), last},
			Count: 1000, Block: lifecycleBlock}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			t := time.NewTimer(lifecycleRetry)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			continue
		}
		for _, s := range res {
			for _, m := range s.Messages {
				last = m.ID
				raw, _ := m.Values["l"].(string)
				var l Lifecycle
				if msgpack.Unmarshal([]byte(raw), &l) == nil {
					f(l)
				}
			}
		}
	}
}
