package eventlog

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/test/testenv"
)

// TestUnfencedSeqsStayBounded: while PostgreSQL is unreachable, the seqs
// of failed sends kept for fenceLoop never exceed maxUnfenced, neither
// when failures add to them nor when fenceLoop's retry puts back what
// still fails (meanwhile new failures filled the set again).
func TestUnfencedSeqsStayBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := store.Open(ctx, testenv.PostgresURL(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	st.Close() // every statement now fails
	l := &Log{st: st, log: slog.New(slog.DiscardHandler), now: time.Now}
	failed := func(conv string, n int) []store.NewMessage {
		msgs := make([]store.NewMessage, n)
		for i := range msgs {
			msgs[i] = store.NewMessage{Conv: conv, Seq: int64(i + 1)}
		}
		return msgs
	}
	kept := func() int {
		l.fmu.Lock()
		defer l.fmu.Unlock()
		n := 0
		for _, seqs := range l.unfenced {
			n += len(seqs)
		}
		if n != l.nUnfenced {
			t.Fatalf("%d seqs kept, counted %d", n, l.nUnfenced)
		}
		return n
	}
	l.fenceFailed(failed("a", maxUnfenced))
	l.fenceFailed(failed("b", 10))
	if n := kept(); n != maxUnfenced {
		t.Fatalf("after failures: %d seqs kept, want %d", n, maxUnfenced)
	}
	pending := l.takeUnfenced()             // fenceLoop takes them out …
	l.fenceFailed(failed("c", maxUnfenced)) // … new failures fill the set again …
	l.refence(pending)                      // … and its retry fails
	if n := kept(); n > maxUnfenced {
		t.Fatalf("after a failed retry: %d seqs kept, more than %d", n, maxUnfenced)
	}
}
