package store

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/parley-im/parley/test/testenv"
)

// callTracer records every call that reaches PostgreSQL through pgx: each
// Exec, Query or QueryRow on its own (begin and commit among them), and
// each batch with the statements it carried. Every entry is at least one
// client-server round trip; a batch's statements share one.
type callTracer struct {
	mu    sync.Mutex
	calls [][]string // one per call: its statements
}

type batchKey struct{}

func (c *callTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	c.calls = append(c.calls, []string{oneLine(d.SQL)})
	c.mu.Unlock()
	return ctx
}

func (c *callTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *callTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.mu.Lock()
	c.calls = append(c.calls, nil)
	i := len(c.calls) - 1
	c.mu.Unlock()
	return context.WithValue(ctx, batchKey{}, i)
}

func (c *callTracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	i := ctx.Value(batchKey{}).(int)
	c.mu.Lock()
	c.calls[i] = append(c.calls[i], oneLine(d.SQL))
	c.mu.Unlock()
}

func (c *callTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *callTracer) take() [][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	calls := c.calls
	c.calls = nil
	return calls
}

func oneLine(sql string) string {
	s := strings.Join(strings.Fields(sql), " ")
	if len(s) > 90 {
		s = s[:90] + "…"
	}
	return s
}

// AdvanceDense locks conversation rows FOR UPDATE; the locks must not be
// held while PostgreSQL waits for the client. It sends the lock, the
// advance and (implicitly) the commit in one batch: the tracer sees one
// call, carrying both statements, and nothing else (no BEGIN, no COMMIT,
// no statement of its own after the lock). The advance still happens.
func TestAdvanceDenseSendsLockAndAdvanceInOneRoundTrip(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	tr := &callTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	snapshots, err := pgxpool.NewWithConfig(ctx, cfg.Copy())
	if err != nil {
		t.Fatal(err)
	}
	st := &Store{pool: pool, snapshots: snapshots}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateUsers(ctx, []string{"ana", "ben"}); err != nil {
		t.Fatal(err)
	}
	convs := []string{"g1", "g2"}
	for _, c := range convs {
		if err := st.CreateConversation(ctx, MembershipChange{Conv: c, Seq: 1, Ts: 1}, "group", "", []string{"ana", "ben"}); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 2 { // the first round prepares the statements, the second reuses them
		var msgs []NewMessage
		for _, c := range convs {
			for i := range int64(3) {
				seq := 2 + 3*int64(round) + i
				msgs = append(msgs, NewMessage{Conv: c, Sender: "ana", Cmid: fmt.Sprint("m", seq), Body: []byte("x"), Seq: seq, Ts: seq})
			}
		}
		if _, err := st.InsertMessages(ctx, msgs, 100); err != nil {
			t.Fatal(err)
		}
		tr.take()
		if err := st.AdvanceDense(ctx, convs); err != nil {
			t.Fatal(err)
		}
		calls := tr.take()
		if len(calls) != 1 || len(calls[0]) != 2 || !strings.Contains(calls[0][0], "FOR UPDATE") {
			t.Fatalf("round %d: AdvanceDense made %d calls, want one batch of the lock and the advance:\n%q", round, len(calls), calls)
		}
		for _, c := range convs {
			var dense int64
			if err := pool.QueryRow(ctx, `SELECT dense_seq FROM conversations WHERE conv_id = $1`, c).Scan(&dense); err != nil {
				t.Fatal(err)
			}
			var head int64
			if err := pool.QueryRow(ctx, `SELECT max(e.seq) FROM events e JOIN conversations c USING (conv_key) WHERE c.conv_id = $1`, c).Scan(&head); err != nil {
				t.Fatal(err)
			}
			if dense != head {
				t.Fatalf("round %d: %s: dense_seq %d after the advance, want %d", round, c, dense, head)
			}
		}
	}
}
