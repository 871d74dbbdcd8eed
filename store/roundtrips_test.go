package store

import (
	"context"
	"errors"
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

func oneLine(sql string) string { return strings.Join(strings.Fields(sql), " ") }

// tracedStore is a migrated store on a new database whose pgx calls tr
// records.
func tracedStore(t *testing.T, ctx context.Context) (st *Store, tr *callTracer) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	tr = &callTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	snapshots, err := pgxpool.NewWithConfig(ctx, cfg.Copy())
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	st = &Store{pool: pool, snapshots: snapshots}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return st, tr
}

// AdvanceDense locks conversation rows FOR UPDATE; the locks must not be
// held while PostgreSQL waits for the client. It sends the lock, the
// advance and (implicitly) the commit in one batch: the tracer sees one
// call, carrying both statements, and nothing else (no BEGIN, no COMMIT,
// no statement of its own after the lock). The advance still happens.
func TestAdvanceDenseSendsLockAndAdvanceInOneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, tr := tracedStore(t, ctx)
	pool := st.pool
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

// An edit holds its conversation's change lock and the message's row
// lock across its seq allocation (so a refused edit allocates nothing),
// and across nothing else that it can avoid: BEGIN, the lock, the
// actor's membership and the locked message go in one batch before the
// allocation, and the edit's write and COMMIT in one batch after it.
// A refused edit and a retry allocate nothing and end with a ROLLBACK.
func TestEditHoldsItsLocksAcrossTheAllocationAndOneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, tr := tracedStore(t, ctx)
	if err := st.CreateUsers(ctx, []string{"ana", "ben"}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateConversation(ctx, MembershipChange{Conv: "g", Seq: 1, Ts: 1}, "group", "", []string{"ana", "ben"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.InsertMessages(ctx, []NewMessage{{Conv: "g", Sender: "ana", Cmid: "m", Body: []byte("m"), Seq: 2, Ts: 2}}, 100); err != nil {
		t.Fatal(err)
	}
	seq := int64(2)
	for round := range 2 { // the first round prepares the statements, the second reuses them
		tr.take()
		var before [][]string
		ch := &MembershipChange{Conv: "g", Actor: "ana", Ts: 10, Alloc: func(context.Context) (int64, error) {
			before = tr.take()
			seq++
			return seq, nil
		}}
		r, err := st.Edit(ctx, ch, 2, []byte(fmt.Sprint("edit ", round)), 1<<40)
		if err != nil || r.Again || r.Seq != seq {
			t.Fatalf("round %d: edit: %+v %v", round, r, err)
		}
		after := tr.take()
		if len(before) != 1 || len(before[0]) != 4 || before[0][0] != "BEGIN" || !strings.Contains(before[0][3], "FOR UPDATE") {
			t.Fatalf("round %d: %d calls before the allocation, want one batch of BEGIN, the lock, the member and the message:\n%q", round, len(before), before)
		}
		if len(after) != 1 || len(after[0]) != 2 || after[0][1] != "COMMIT" {
			t.Fatalf("round %d: %d calls after the allocation, want one batch of the write and COMMIT:\n%q", round, len(after), after)
		}
	}
	for _, c := range []struct {
		name  string
		actor string
		body  string
		want  error
	}{
		{"retry", "ana", "edit 1", nil},
		{"not the sender", "ben", "x", ErrNotSender},
		{"not a member", "cy", "x", ErrNotMember},
	} {
		tr.take()
		ch := &MembershipChange{Conv: "g", Actor: c.actor, Ts: 20, Alloc: func(context.Context) (int64, error) {
			t.Errorf("%s: allocated a seq", c.name)
			return 0, errors.New("refused edits allocate nothing")
		}}
		r, err := st.Edit(ctx, ch, 2, []byte(c.body), 1<<40)
		if !errors.Is(err, c.want) || (c.want == nil && !r.Again) {
			t.Fatalf("%s: %+v %v, want %v", c.name, r, err, c.want)
		}
		calls := tr.take()
		if len(calls) != 2 || len(calls[0]) != 4 || len(calls[1]) != 1 || calls[1][0] != "ROLLBACK" {
			t.Fatalf("%s: want the batch and a ROLLBACK, got %q", c.name, calls)
		}
	}
}
