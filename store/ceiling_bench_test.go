package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parley-im/parley/test/testenv"
)

// BenchmarkInsertCeiling measures what this PostgreSQL takes for plain
// ~100-byte rows: one row per commit, and 100-row batches. It is the
// reference ceiling BENCHMARKS.md sets Parley's durable send rate against.
func BenchmarkInsertCeiling(b *testing.B) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE t (k text, seq bigint, body bytea, PRIMARY KEY (k, seq))`); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 100)
	var seq int64
	for _, rows := range []int{1, 100} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			ks, seqs, bodies := make([]string, rows), make([]int64, rows), make([][]byte, rows)
			start := time.Now()
			n := 0
			for b.Loop() {
				for i := range ks {
					seq++
					ks[i], seqs[i], bodies[i] = "c", seq, body
				}
				if _, err := conn.Exec(ctx, `INSERT INTO t SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[])`, ks, seqs, bodies); err != nil {
					b.Fatal(err)
				}
				n += rows
			}
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "rows/s")
		})
	}
}
