package fanout

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/test/testenv"
)

// TestRowsCloseLeavesBlockedReads: Close waits for the work in hand, not
// for the stream readers blocked in Redis (a shutdown would otherwise
// take up to readBlock); an entry those readers get after Close is left
// pending for another process to claim, and Wait returns once the Redis
// client is closed.
func TestRowsCloseLeavesBlockedReads(t *testing.T) {
	rdb, prefix := testenv.RedisClient(t)
	name := "rows-close-" + strings.Trim(prefix, ":")
	own := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, DB: rdb.Options().DB, ClientName: name})
	r := NewRows(own, prefix, "test", RowsConfig{Workers: 2, ClaimIdle: time.Minute, Timeout: 5 * time.Second}, slog.New(slog.DiscardHandler), nil)
	ctx := t.Context()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Both readers are blocked in XREADGROUP.
	testenv.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		list, err := rdb.ClientList(ctx).Result()
		if err != nil {
			return err
		}
		n := 0
		for _, l := range strings.Split(list, "\n") {
			if strings.Contains(l, "name="+name+" ") && strings.Contains(l, "cmd=xreadgroup") && strings.Contains(l, "flags=b") {
				n++
			}
		}
		if n != 2 {
			return fmt.Errorf("%d readers blocked, want 2", n)
		}
		return nil
	})
	start := time.Now()
	r.Close()
	if took := time.Since(start); took >= readBlock {
		t.Fatalf("Close took %v: it waited for the blocked reads (%v)", took, readBlock)
	}
	// An entry that arrives now is read by a stopped reader: not applied.
	if err := r.add(ctx, []RowJob{{Conv: "c", Ts: 7, Users: []string{"u"}}}); err != nil {
		t.Fatal(err)
	}
	testenv.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		p, err := rdb.XPending(ctx, r.stream, rowsGroup).Result()
		if err != nil {
			return err
		}
		if p.Count != 1 {
			return fmt.Errorf("%d entries pending, want 1", p.Count)
		}
		return nil
	})
	if n, err := rdb.Exists(ctx, r.key("u")).Result(); err != nil || n != 0 {
		t.Fatalf("the row was written after Close (exists %d, %v)", n, err)
	}
	_ = own.Close()
	r.Wait()
}
