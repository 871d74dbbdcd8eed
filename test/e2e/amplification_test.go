package e2e_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
)

// BenchmarkWriteAmplification measures the writes one message costs in each
// fan-out tier (the model column of docs/fanout.md, "Tiers"): a group of 40
// members, 8 of them online, one member sending. Each tier gets its own
// database and its own redis-server, so PostgreSQL's row counters and Redis's
// command counters see only this traffic. Reported per message:
//
//   - pg-rows/msg: rows added to PostgreSQL (the event; plus one update
//     of the conversation's dense_seq watermark per second, not counted);
//   - redis-writes/msg: Redis write commands (scripts count as one);
//   - row-jobs/msg: per-member conversation row writes fan-out asked for
//     (parley_fanout_row_jobs_total): the seed's write amplification;
//   - row-writes/msg: ZADDs Redis actually ran: a fan-out stream entry
//     carries up to 10 ms of jobs and writes each member's row once, so
//     back-to-back messages in one conversation share them;
//
// next to the seed's model: push ≈ N (members), online ≈ online members,
// pull ≈ 1.
//
//	go test -run '^$' -bench WriteAmplification -benchtime 200x ./server/
func BenchmarkWriteAmplification(b *testing.B) {
	const members, online = 40, 8
	for _, tc := range []struct {
		tier                string
		writeMax, onlineMax int
	}{{"push", 100, 1000}, {"online", 10, 100}, {"pull", 10, 20}} {
		b.Run(tc.tier, func(b *testing.B) {
			redisSrv := testenv.StartRedis(b)
			cfg := parleytest.Config(b)
			cfg.RedisURL, cfg.RedisPrefix = redisSrv.URL(), "wa:"
			cfg.WriteFanoutMax, cfg.OnlineFanoutMax = tc.writeMax, tc.onlineMax
			cfg.SendRate = 0
			env := parleytest.Start(b, cfg)
			users, devs := env.Users(b, "u%02d", members)
			env.Group(b, "g", users...)
			ctx := context.Background()
			var conns []*client.Conn
			for _, d := range devs[:online] {
				c, err := client.Dial(ctx, env.Addr, d.ID, d.Token, client.DialOptions{})
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				conns = append(conns, c)
			}
			rdb := redis.NewClient(&redis.Options{Addr: redisSrv.Addr()})
			defer rdb.Close()
			pg, err := pgx.Connect(ctx, cfg.PostgresURL)
			if err != nil {
				b.Fatal(err)
			}
			defer pg.Close(ctx)
			// settle is the measurement's margin, on purpose: the writes
			// that follow a send (fan-out, row jobs, held acks) land in
			// the background, and no counter tells when the last of them
			// did.
			settle := func() { time.Sleep(300 * time.Millisecond) }
			settle()
			r0, z0 := redisWrites(b, rdb)
			p0 := pgWrites(b, pg)
			j0 := env.Srv.MetricSum("parley_fanout_row_jobs_total")
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := conns[0].Send(ctx, "g", strconv.Itoa(i), []byte("m")); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			settle()
			r1, z1 := redisWrites(b, rdb)
			p1 := pgWrites(b, pg)
			j1 := env.Srv.MetricSum("parley_fanout_row_jobs_total")
			n := float64(b.N)
			b.ReportMetric((j1-j0)/n, "row-jobs/msg")
			b.ReportMetric(float64(p1-p0)/n, "pg-rows/msg")
			b.ReportMetric(float64(r1-r0)/n, "redis-writes/msg")
			b.ReportMetric(float64(z1-z0)/n, "row-writes/msg")
			model := map[string]int{"push": members, "online": online, "pull": 1}[tc.tier]
			b.ReportMetric(float64(model), "model/msg")
		})
	}
}

// redisWrites returns the server's count of write commands and of ZADD
// members written (from INFO commandstats and the rows' scores).
func redisWrites(b *testing.B, rdb *redis.Client) (writes, zadds int64) {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	writeCmds := map[string]bool{"set": true, "incrby": true, "incr": true, "hset": true, "hdel": true, "zadd": true,
		"xadd": true, "xack": true, "xdel": true, "sadd": true, "srem": true, "del": true, "evalsha": true, "eval": true,
		"publish": false}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		c, _ := strconv.ParseInt(calls, 10, 64)
		if writeCmds[name] {
			writes += c
		}
		if name == "zadd" {
			zadds = c
		}
	}
	return writes, zadds
}

// pgWrites returns the rows of Parley's per-message tables (events, and
// the per-member tables that write fan-out in PostgreSQL would fill):
// pg_stat counters reach the statistics only every few seconds.
func pgWrites(b *testing.B, pg *pgx.Conn) int64 {
	var n int64
	if err := pg.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM device_cursors)
		+ (SELECT count(*) FROM read_positions)`).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}
