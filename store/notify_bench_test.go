package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5"

	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/test/testenv"
)

// BenchmarkUnreadTotal measures a notification's badge: the exact total
// unread of a user in 1,000 conversations of 200 events each. convs=1000
// is a user with long unread ranges (every 10th message the user's own;
// 20 conversations entirely unread, 100 half read, the rest read);
// few-unread is another member of the same conversations with the last
// 10 messages of 120 of them unread, the usual shape. One call per
// notification, so its cost bounds how many notifications a second
// PostgreSQL can badge.
//
//	go test -run '^$' -bench UnreadTotal -benchtime 200x ./store/
func BenchmarkUnreadTotal(b *testing.B) {
	const convs, events, unread, half, fewUnread = 1000, 200, 20, 100, 10
	ctx := context.Background()
	dbURL := testenv.PostgresURL(b)
	st, err := store.Open(ctx, dbURL, 4)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`INSERT INTO users (user_id) VALUES ('bench-user'), ('bench-other'), ('bench-few')`,
		fmt.Sprintf(`INSERT INTO conversations (conv_id, kind, member_count) SELECT 'c' || lpad(c::text, 4, '0'), 'group', 2 FROM generate_series(1, %d) c`, convs),
		`INSERT INTO membership_periods (conv_id, user_id, from_seq) SELECT conv_id, u, 1 FROM conversations, unnest(ARRAY['bench-user', 'bench-other', 'bench-few']) u`,
		fmt.Sprintf(`INSERT INTO events (conv_key, seq, kind, sender, cmid, body, ts, users)
			SELECT (SELECT conv_key FROM conversations WHERE conv_id = 'c' || lpad(c::text, 4, '0')), s, CASE WHEN s = 1 THEN 2 ELSE 1 END,
			       CASE WHEN s = 1 THEN '' WHEN s %% 10 = 0 THEN 'bench-user' ELSE 'bench-other' END,
			       CASE WHEN s = 1 THEN NULL ELSE 'm' || s END, CASE WHEN s = 1 THEN NULL ELSE '\x00'::bytea END,
			       1700000000000 + c * 1000 + s, CASE WHEN s = 1 THEN ARRAY['bench-user', 'bench-other'] END
			  FROM generate_series(1, %d) c, generate_series(1, %d) s`, convs, events),
		fmt.Sprintf(`INSERT INTO read_positions (user_id, conv_id, read_seq)
			SELECT 'bench-user', conv_id, CASE WHEN n <= %[1]d THEN 0 WHEN n <= %[1]d + %[2]d THEN %[3]d / 2 ELSE %[3]d END
			  FROM (SELECT conv_id, row_number() OVER (ORDER BY conv_id) n FROM conversations) x`, unread, half, events),
		fmt.Sprintf(`INSERT INTO read_positions (user_id, conv_id, read_seq)
			SELECT 'bench-few', conv_id, CASE WHEN n <= %[1]d THEN %[2]d - %[3]d ELSE %[2]d END
			  FROM (SELECT conv_id, row_number() OVER (ORDER BY conv_id) n FROM conversations) x`, unread+half, events, fewUnread),
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
	ids := make([]string, convs)
	for i := range ids {
		ids[i] = fmt.Sprintf("c%04d", i+1)
	}
	if err := st.AdvanceDense(ctx, ids); err != nil {
		b.Fatal(err)
	}
	for _, t := range []string{"events", "membership_periods", "read_positions", "own_msg_buckets"} {
		if _, err := conn.Exec(ctx, "VACUUM (ANALYZE) "+t); err != nil {
			b.Fatal(err)
		}
	}
	// Others' messages: seqs 2..events, less the user's own (every 10th).
	perConv := int64(events - 1 - events/10)
	halfConv := int64(events/2 - events/20) // seqs above events/2, less the user's own
	want := unread*perConv + half*halfConv
	for _, c := range []struct {
		name, user string
		want       int64
	}{
		{fmt.Sprintf("convs=%d", convs), "bench-user", want},
		{"few-unread", "bench-few", (unread + half) * fewUnread}, // none of them the user's own
	} {
		b.Run(c.name, func(b *testing.B) {
			h := hdrhistogram.New(1, 10_000_000, 3)
			pg0, self0 := postgresCPU(), selfCPU()
			for b.Loop() {
				start := time.Now()
				got, err := st.UnreadTotals(ctx, []string{c.user})
				if err != nil {
					b.Fatal(err)
				}
				_ = h.RecordValue(time.Since(start).Microseconds())
				if got[c.user] != c.want {
					b.Fatalf("unread total %d, want %d", got[c.user], c.want)
				}
			}
			b.ReportMetric(float64(h.ValueAtQuantile(50))/1000, "p50-ms")
			b.ReportMetric(float64(h.ValueAtQuantile(99))/1000, "p99-ms")
			n := float64(h.TotalCount())
			b.ReportMetric(float64((postgresCPU()-pg0).Microseconds())/n, "postgres-µs/op")
			b.ReportMetric(float64((selfCPU()-self0).Microseconds())/n, "go-µs/op")
		})
	}
}
