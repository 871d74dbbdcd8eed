package store_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/fanout"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/test/testenv"
)

// The convs benchmark needs a big database: one user in 1,000
// conversations of 10,000 events each (10 million events); the 20 most
// recently active conversations are entirely unread (10,000 unread each),
// 100 more are half read, the rest fully read. Building it takes minutes,
// so it is built once into a database of its own (parley_bench_convs) and
// reused; set PARLEY_BENCH_BIG=1 to run it:
//
//	PARLEY_BENCH_BIG=1 go test -run '^$' -bench Convs -benchtime 200x ./store/
const (
	benchConvs     = 1000
	benchEvents    = 10000
	benchUser      = "bench-user"
	benchDevice    = "bench-user-d1"
	benchDBName    = "parley_bench_convs"
	benchUnread    = 20
	benchHalfRead  = 100
	benchReadyMark = "bench_ready_v1"
)

func BenchmarkConvs(b *testing.B) {
	if os.Getenv("PARLEY_BENCH_BIG") == "" {
		b.Skip("set PARLEY_BENCH_BIG=1: builds a 10-million-event database once (minutes)")
	}
	ctx := context.Background()
	dbURL := benchDatabase(b, ctx)
	st, err := store.Open(ctx, dbURL, 4)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	// The user's conversation rows, as fan-out keeps them in Redis: the
	// first convs finds them missing and returns them for backfill.
	redisURL, prefix := testenv.Redis(b)
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		b.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	rows := fanout.NewRows(rdb, prefix, "bench", fanout.RowsConfig{}, slog.New(slog.DiscardHandler), nil)
	small := store.ConvOrder{SmallBelow: 200}
	first, err := st.Conversations(ctx, benchUser, benchDevice, 100, nil, small)
	if err != nil {
		b.Fatal(err)
	}
	if err := rows.Backfill(ctx, benchUser, first.Backfill); err != nil {
		b.Fatal(err)
	}
	for _, run := range []struct {
		limit  int
		clears bool
	}{{100, false}, {1000, false}, {100, true}, {1000, true}} {
		limit := run.limit
		if run.clears {
			// "Delete for me" in every conversation that has been read:
			// cleared up to half of what was read (unread counts stay).
			setClears(b, ctx, dbURL, `read_seq / 2`)
			b.Cleanup(func() { setClears(b, context.Background(), dbURL, `0`) })
		}
		b.Run(fmt.Sprintf("convs=%d/events=%dM/limit=%d/clears=%v", benchConvs, benchConvs*benchEvents/1_000_000, limit, run.clears), func(b *testing.B) {
			h := hdrhistogram.New(1, 10_000_000, 3)
			b.ReportAllocs()
			pg0, self0 := postgresCPU(), selfCPU()
			for b.Loop() {
				start := time.Now()
				order := small
				if order.Rows, err = rows.Read(ctx, benchUser); err != nil {
					b.Fatal(err)
				}
				page, err := st.Conversations(ctx, benchUser, benchDevice, limit, nil, order)
				if err != nil {
					b.Fatal(err)
				}
				items := page.Items
				_ = h.RecordValue(time.Since(start).Microseconds())
				if len(items) != limit || items[0].Unread != benchEvents-1-benchEvents/10 {
					b.Fatalf("got %d items, first unread %d", len(items), items[0].Unread)
				}
			}
			b.ReportMetric(float64(h.ValueAtQuantile(50))/1000, "p50-ms")
			b.ReportMetric(float64(h.ValueAtQuantile(99))/1000, "p99-ms")
			b.ReportMetric(float64(h.Max())/1000, "max-ms")
			// Server CPU per call: PostgreSQL's (every postgres process on
			// the machine) and this process's (what parleyd would spend).
			n := float64(h.TotalCount())
			b.ReportMetric(float64((postgresCPU()-pg0).Microseconds())/n, "postgres-µs/op")
			b.ReportMetric(float64((selfCPU()-self0).Microseconds())/n, "go-µs/op")
		})
	}
}

// setClears sets the benchmark user's cleared positions to expr (of
// read_seq) in the conversations it has read.
func setClears(b *testing.B, ctx context.Context, dbURL, expr string) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE read_positions SET cleared_seq = `+expr+` WHERE user_id = $1 AND read_seq > 0`, benchUser); err != nil {
		b.Fatal(err)
	}
}

// benchDatabase returns the URL of the benchmark database, building it if
// it is not there yet.
func benchDatabase(b *testing.B, ctx context.Context) string {
	base := os.Getenv(testenv.EnvPostgresURL)
	if base == "" {
		base = testenv.DefaultPostgresURL
	}
	u, err := url.Parse(base)
	if err != nil {
		b.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(ctx)
	var exists bool
	_ = admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, benchDBName).Scan(&exists)
	if !exists {
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+benchDBName); err != nil {
			b.Fatal(err)
		}
	}
	u.Path = "/" + benchDBName
	dbURL := u.String()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	var ready bool
	_ = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_tables WHERE tablename = $1)`, benchReadyMark).Scan(&ready)
	if ready {
		// Bring an older benchmark database up to the current schema.
		st, err := store.Open(ctx, dbURL, 2)
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		if err := st.Migrate(ctx); err != nil {
			b.Fatal(err)
		}
		advanceAll(b, ctx, st)
		// As autovacuum would have by now (index-only scans need the
		// visibility map).
		_, _ = conn.Exec(ctx, `VACUUM (ANALYZE) events`)
		_, _ = conn.Exec(ctx, `VACUUM (ANALYZE) own_msg_buckets`)
		return dbURL
	}
	b.Logf("building %s: %d conversations × %d events", benchDBName, benchConvs, benchEvents)
	st, err := store.Open(ctx, dbURL, 2)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	steps := []string{
		`TRUNCATE users, devices, conversations, membership_periods, events, device_cursors, read_positions CASCADE`,
		`INSERT INTO users (user_id) VALUES ('bench-user'), ('bench-other')`,
		`INSERT INTO devices (device_id, user_id, token_sha256) VALUES ('bench-user-d1', 'bench-user', '\x00')`,
		fmt.Sprintf(`INSERT INTO conversations (conv_id, kind, member_count) SELECT 'c' || lpad(c::text, 4, '0'), 'group', 2 FROM generate_series(1, %d) c`, benchConvs),
		`INSERT INTO membership_periods (conv_id, user_id, from_seq) SELECT conv_id, u, 1 FROM conversations, unnest(ARRAY['bench-user', 'bench-other']) u`,
		// Conversation c's events have ts growing with c, so the highest
		// numbered conversations are the most recently active. Seq 1 is the
		// join; every 10th message is the user's own.
		fmt.Sprintf(`INSERT INTO events (conv_key, seq, kind, sender, cmid, body, ts, users)
			SELECT (SELECT conv_key FROM conversations WHERE conv_id = 'c' || lpad(c::text, 4, '0')), s,
			       CASE WHEN s = 1 THEN 2 ELSE 1 END,
			       CASE WHEN s = 1 THEN '' WHEN s %% 10 = 0 THEN 'bench-user' ELSE 'bench-other' END,
			       CASE WHEN s = 1 THEN NULL ELSE 'm' || s END,
			       CASE WHEN s = 1 THEN NULL ELSE decode(repeat('ab', 50), 'hex') END,
			       1700000000000 + c * 100000 + s,
			       CASE WHEN s = 1 THEN ARRAY['bench-user', 'bench-other'] END
			  FROM generate_series(1, %d) c, generate_series(1, %d) s`, benchConvs, benchEvents),
		fmt.Sprintf(`INSERT INTO read_positions (user_id, conv_id, read_seq)
			SELECT 'bench-user', conv_id,
			       CASE WHEN n > %[1]d - %[2]d THEN 0 WHEN n > %[1]d - %[2]d - %[3]d THEN %[4]d / 2 ELSE %[4]d END
			  FROM (SELECT conv_id, row_number() OVER (ORDER BY conv_id) n FROM conversations) x`, benchConvs, benchUnread, benchHalfRead, benchEvents),
		`VACUUM (ANALYZE) events`,
		`VACUUM (ANALYZE) membership_periods`,
		`VACUUM (ANALYZE) read_positions`,
		`VACUUM (ANALYZE) own_msg_buckets`,
		`CREATE TABLE ` + benchReadyMark + ` ()`,
	}
	for i, q := range steps {
		if _, err := conn.Exec(ctx, q); err != nil {
			b.Fatalf("%s: %v", q, err)
		}
		if i == 5 { // the events are in
			advanceAll(b, ctx, st)
		}
	}
	b.Logf("built in %s", time.Since(start).Round(time.Second))
	return dbURL
}

// advanceAll raises every conversation's dense_seq watermark (and counts
// own messages into their buckets) as fan-out does after commits.
func advanceAll(b *testing.B, ctx context.Context, st *store.Store) {
	var ids []string
	for c := 1; c <= benchConvs; c++ {
		ids = append(ids, fmt.Sprintf("c%04d", c))
	}
	for len(ids) > 0 {
		n := min(len(ids), 100)
		if err := st.AdvanceDense(ctx, ids[:n]); err != nil {
			b.Fatal(err)
		}
		ids = ids[n:]
	}
}

// postgresCPU is the CPU time used so far by every process named postgres.
func postgresCPU() time.Duration {
	var total time.Duration
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		b, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open || s[open+1:end] != "postgres" {
			continue
		}
		f := strings.Fields(s[end+2:])
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(ut+st) * time.Second / 100 // USER_HZ
	}
	return total
}

// selfCPU is this process's CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
