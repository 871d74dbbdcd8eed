package e2e_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/fanout"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
	"github.com/parley-im/parley/wire"
)

// rowsKey is the conversation-rows key of user (package fanout's layout).
func rowsKey(prefix, user string) string { return prefix + "rows:{" + user + "}" }

// TestConvsOrderFollowsRows: sends in push-tier groups raise every
// member's conversation row, and convs lists conversations newest first
// by them, paged with cursor.
func TestConvsOrderFollowsRows(t *testing.T) {
	t.Parallel()
	env := parleytest.Start(t, parleytest.Config(t))
	rdb := parleytest.RedisClient(t, env.Cfg)
	ana := env.User(t, "ana", 1)
	ben := env.User(t, "ben", 1)
	env.User(t, "cy", 1)
	for i := 0; i < 5; i++ {
		env.Group(t, fmt.Sprintf("g%d", i), "ana", "ben", "cy")
	}
	ca, _ := dial(t, env, ana[0])
	cb, _ := dial(t, env, ben[0])
	// Activity order, oldest first: g3, g0, g4, g1, g2.
	var lastTs int64
	for _, g := range []string{"g3", "g0", "g4", "g1", "g2"} {
		// Distinct ts (milliseconds): the clock has moved past the last one.
		testenv.CheckFor(t, time.Second, time.Millisecond, func() error {
			if now := time.Now().UnixMilli(); now <= lastTs {
				return fmt.Errorf("clock at %d ms, not past the last send's ts %d", now, lastTs)
			}
			return nil
		})
		r, err := ca.Send(ctx(t), g, "m-"+g, []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		lastTs = r.Ts
	}
	for _, u := range []string{"ana", "ben", "cy"} {
		testenv.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			ts, err := rdb.ZScore(context.Background(), rowsKey(env.Cfg.RedisPrefix, u), "g2").Result()
			if err != nil || int64(ts) != lastTs {
				return fmt.Errorf("%s's row of g2 = %v, %v; want %d", u, ts, err, lastTs)
			}
			return nil
		})
	}
	want := []string{"g2", "g1", "g4", "g0", "g3"}
	var got []string
	cur := ""
	for page := 0; page < 5; page++ {
		c, err := cb.Convs(ctx(t), 2, cur)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range c.Items {
			got = append(got, it.Conv)
		}
		if !c.More {
			break
		}
		cur = c.Cursor
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("convs order %v, want %v", got, want)
	}
	// Rows lost (a Redis flush) are rebuilt by the next convs.
	if err := rdb.Del(context.Background(), rowsKey(env.Cfg.RedisPrefix, "ben")).Err(); err != nil {
		t.Fatal(err)
	}
	c, err := cb.Convs(ctx(t), 0, "")
	if err != nil || len(c.Items) != 5 || c.Items[0].Conv != "g2" || c.Items[4].Conv != "g3" {
		t.Fatalf("convs without rows: %+v %v", c, err)
	}
	testenv.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		n, err := rdb.ZCard(context.Background(), rowsKey(env.Cfg.RedisPrefix, "ben")).Result()
		if err != nil || n != 5 {
			return fmt.Errorf("ben's rows after backfill: %d %v", n, err)
		}
		return nil
	})
}

// TestFaultFanoutWorkerKilledMidFanout: a fan-out that fails halfway is
// finished by another worker and never undoes the commit. The row writes
// at the commit fail (every member's rows key holds a string: Redis
// answers WRONGTYPE), so they go to the durable stream; a fan-out worker
// takes those entries and dies before finishing them. The messages stay
// committed, online devices still get every push, and once the fault is
// gone and the entries have been idle for fanout_claim_idle another worker
// claims them and every member's row converges. Counts confirmed messages
// lost, duplicated and out of order at the receivers: all must be 0.
func TestFaultFanoutWorkerKilledMidFanout(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	cfg.FanoutWorkers = 0 // no reader here: the "dead" worker below takes every entry
	cfg.FanoutClaimIdle = 500 * time.Millisecond
	env := parleytest.Start(t, cfg)
	rdb := parleytest.RedisClient(t, env.Cfg)
	const members = 6
	users, devices := env.Users(t, "u%d", members)
	env.Group(t, "big", users...)
	stream := env.Cfg.RedisPrefix + "fanout:{rows}"

	sender, _ := dial(t, env, devices[0])
	type rx struct {
		mu   sync.Mutex
		seqs []int64
	}
	receivers := make([]*rx, members)
	for i := 1; i < members; i++ {
		r := &rx{}
		receivers[i] = r
		_, frames := dial(t, env, devices[i])
		done := make(chan struct{}) // frames is never closed: the reader stops with the test
		t.Cleanup(func() { close(done) })
		go func() {
			for {
				select {
				case <-done:
					return
				case m := <-frames:
					if m.T == wire.TPush && m.Conv == "big" && m.Kind == "msg" {
						r.mu.Lock()
						r.seqs = append(r.seqs, m.Seq)
						r.mu.Unlock()
					}
				}
			}
		}()
	}

	// The dying worker: it reads entries as they are appended and never
	// acknowledges them, while messages keep coming.
	dead := make(chan int, 1)
	stopDead := make(chan struct{})
	var newest atomic.Int64 // the newest message ts in the entries the dying worker took
	go func() {
		taken := 0
		defer func() { dead <- taken }()
		for {
			select {
			case <-stopDead:
				return
			default:
			}
			res, err := rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: "rows", Consumer: "dying-worker",
				Streams: []string{stream, ">"}, Count: 10, Block: 100 * time.Millisecond}).Result()
			if err != nil {
				continue
			}
			for _, s := range res {
				taken += len(s.Messages)
				for _, m := range s.Messages {
					var jobs []fanout.RowJob
					if payload, ok := m.Values["j"].(string); ok && msgpack.Unmarshal([]byte(payload), &jobs) == nil {
						for _, j := range jobs {
							if j.Conv == "big" && j.Ts > newest.Load() {
								newest.Store(j.Ts)
							}
						}
					}
				}
			}
		}
	}()
	// The fault: no member's row can be written.
	for _, u := range users {
		if err := rdb.Set(context.Background(), rowsKey(env.Cfg.RedisPrefix, u), "not a sorted set", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var confirmed []int64
	var lastTs int64
	for i := 0; i < 40; i++ {
		r, err := sender.Send(ctx(t), "big", fmt.Sprint(i), []byte("m"))
		if err != nil {
			t.Fatal(err)
		}
		confirmed = append(confirmed, r.Seq)
		lastTs = r.Ts
	}
	// It dies once it took the entry of the last message: every row
	// write is then in its hands.
	testenv.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if n := newest.Load(); n < lastTs {
			return fmt.Errorf("the dying worker has taken row writes up to ts %d, not the last message's %d", n, lastTs)
		}
		return nil
	})
	close(stopDead) // the worker dies holding its entries
	if taken := <-dead; taken == 0 {
		t.Fatal("the dying worker took no entries; the test proves nothing")
	}
	for _, u := range users { // the fault is gone
		if err := rdb.Del(context.Background(), rowsKey(env.Cfg.RedisPrefix, u)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Every member's row converges once the entries are claimed.
	for _, u := range users {
		testenv.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			ts, err := rdb.ZScore(context.Background(), rowsKey(env.Cfg.RedisPrefix, u), "big").Result()
			if err != nil || int64(ts) != lastTs {
				return fmt.Errorf("%s's row of big = %v, %v; want %d", u, ts, err, lastTs)
			}
			return nil
		})
	}
	testenv.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		pending, err := rdb.XPending(context.Background(), stream, "rows").Result()
		if err != nil || pending.Count != 0 {
			return fmt.Errorf("entries still pending: %+v %v", pending, err)
		}
		return nil
	})
	lost, dup, reordered := 0, 0, 0
	for i := 1; i < members; i++ {
		r := receivers[i]
		testenv.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			r.mu.Lock()
			defer r.mu.Unlock()
			if len(r.seqs) < len(confirmed) {
				return fmt.Errorf("%s has %d of %d pushes", users[i], len(r.seqs), len(confirmed))
			}
			return nil
		})
		r.mu.Lock()
		seen := map[int64]bool{}
		var prev int64
		for _, s := range r.seqs {
			if seen[s] {
				dup++
			}
			if s < prev {
				reordered++
			}
			seen[s], prev = true, s
		}
		for _, s := range confirmed {
			if !seen[s] {
				lost++
			}
		}
		r.mu.Unlock()
	}
	t.Logf("confirmed %d messages to %d receivers: lost %d, duplicated %d, out of order %d", len(confirmed), members-1, lost, dup, reordered)
	if lost+dup+reordered != 0 {
		t.Fatalf("lost %d, duplicated %d, out of order %d", lost, dup, reordered)
	}
}

// afterTs waits until the clock is past ts (Unix ms), so that the next
// send's ts differs from it.
func afterTs(t *testing.T, ts int64) {
	t.Helper()
	testenv.CheckFor(t, time.Second, time.Millisecond, func() error {
		if now := time.Now().UnixMilli(); now <= ts {
			return fmt.Errorf("clock at %d ms, not past %d", now, ts)
		}
		return nil
	})
}

// TestConvsReflectsWhatTheCallerWasTold: convs orders by every message
// its caller was told of: right after send_ok, the sender's and another
// member's convs list the conversation first, and so does a third
// member's right after the push.
func TestConvsReflectsWhatTheCallerWasTold(t *testing.T) {
	t.Parallel()
	env := parleytest.Start(t, parleytest.Config(t))
	ana := env.User(t, "ana", 1)
	ben := env.User(t, "ben", 1)
	cy := env.User(t, "cy", 1)
	const groups = 20
	for i := range groups {
		env.Group(t, fmt.Sprintf("g%02d", i), "ana", "ben", "cy")
	}
	ca, _ := dial(t, env, ana[0])
	cb, _ := dial(t, env, ben[0])
	cc, frames := dial(t, env, cy[0])
	first := func(who string, c *client.Conn, conv string) {
		t.Helper()
		page, err := c.Convs(ctx(t), 5, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Items) == 0 || page.Items[0].Conv != conv {
			var got []string
			for _, it := range page.Items {
				got = append(got, fmt.Sprintf("%s@%d", it.Conv, it.LastTs))
			}
			t.Fatalf("%s's convs right after %s's message: %v, want %s first", who, conv, got, conv)
		}
	}
	var last int64
	for i := range 2 * groups {
		conv := fmt.Sprintf("g%02d", i%groups) // each time the least recent
		afterTs(t, last)
		m := mustSend(t, ca, conv, fmt.Sprint("m", i), []byte("x"))
		last = m.Ts
		first("the sender", ca, conv)
		first("another member", cb, conv)
		waitPush(t, frames, conv, m.Seq)
		first("a member pushed to", cc, conv)
	}
}

// TestConvsWalkSeesEachConversationOnce: a paged walk of 1,001
// conversations right after a few sends, with nothing sent during the
// walk, lists each conversation exactly once.
func TestConvsWalkSeesEachConversationOnce(t *testing.T) {
	t.Parallel()
	env := parleytest.Start(t, parleytest.Config(t))
	ana := env.User(t, "ana", 1)
	ben := env.User(t, "ben", 1)
	const n = 1001
	var convs []map[string]any
	for i := range n {
		convs = append(convs, map[string]any{"id": fmt.Sprintf("c%04d", i), "kind": "group", "members": []string{"ana", "ben"}})
	}
	if st := env.Admin(t, "POST", "/v1/bulk/conversations", map[string]any{"conversations": convs}, nil); st != 200 && st != 201 {
		t.Fatalf("bulk conversations: %d", st)
	}
	ca, _ := dial(t, env, ana[0])
	cb, _ := dial(t, env, ben[0])
	for round := range 5 {
		for k := range 3 { // conversations from the bottom of the list
			mustSend(t, ca, fmt.Sprintf("c%04d", (round*3+k)*37%n), fmt.Sprint("m", round, k), []byte("x"))
		}
		seen := map[string]int{}
		cur := ""
		for page := 0; page < 2*n/100; page++ {
			c, err := cb.Convs(ctx(t), 0, cur) // the default page size
			if err != nil {
				t.Fatal(err)
			}
			for _, it := range c.Items {
				seen[it.Conv]++
			}
			if !c.More {
				break
			}
			cur = c.Cursor
		}
		if len(seen) != n {
			t.Fatalf("round %d: the walk listed %d of %d conversations", round, len(seen), n)
		}
		for c, k := range seen {
			if k != 1 {
				t.Fatalf("round %d: %s listed %d times", round, c, k)
			}
		}
	}
}
