package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/store"
)

// An edit holds its conversation's change lock shared, as send batches
// do: a send batch and an edit of another message go through while an
// edit is in flight; a second edit of the same message waits for the
// first and gets the higher seq, so its body stands; a removal of the
// editor waits for the edit and gets a seq above it.
func TestEditOrdering(t *testing.T) {
	t.Parallel()
	env, st, ctx := startStore(t)
	env.Group(t, "g", "ana", "ben") // seq 1
	res, err := st.InsertMessages(ctx, []store.NewMessage{
		{Conv: "g", Sender: "ana", Cmid: "m2", Body: []byte("two"), Seq: 2, Ts: 2},
		{Conv: "g", Sender: "ana", Cmid: "m3", Body: []byte("three"), Seq: 3, Ts: 3},
	}, 100)
	if err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("insert: %+v %v", res, err)
	}
	var counter atomic.Int64
	counter.Store(3)
	next := func(context.Context) (int64, error) { return counter.Add(1), nil }

	// The first edit of message 2 stops inside its transaction, holding
	// the change lock and the message's row, until release is closed.
	inside, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	releaseIt := func() { once.Do(func() { close(release) }) }
	t.Cleanup(releaseIt) // a failing check must not leave the edit hanging
	first := make(chan error, 1)
	var firstSeq atomic.Int64
	go func() {
		ch := &store.MembershipChange{Conv: "g", Actor: "ana", Ts: 10, Alloc: func(ctx context.Context) (int64, error) {
			close(inside)
			<-release
			return next(ctx)
		}}
		_, err := st.Edit(ctx, ch, 2, []byte("first"), 1<<40)
		firstSeq.Store(ch.Seq)
		first <- err
	}()
	<-inside

	within := func(what string, f func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s waited for the edit in flight", what)
		}
	}
	within("a send batch", func() error {
		seq, _ := next(ctx)
		res, err := st.InsertMessages(ctx, []store.NewMessage{{Conv: "g", Sender: "ben", Cmid: "b1", Body: []byte("hi"), Seq: seq, Ts: 11}}, 100)
		if err == nil && res[0].Err != nil {
			err = res[0].Err
		}
		return err
	})
	within("an edit of another message", func() error {
		_, err := st.Edit(ctx, &store.MembershipChange{Conv: "g", Actor: "ana", Ts: 12, Alloc: next}, 3, []byte("three!"), 1<<40)
		return err
	})

	// These two must wait for the first edit.
	second := make(chan error, 1)
	secondCh := &store.MembershipChange{Conv: "g", Actor: "ana", Ts: 13, Alloc: next}
	go func() {
		_, err := st.Edit(ctx, secondCh, 2, []byte("second"), 1<<40)
		second <- err
	}()
	removal := make(chan error, 1)
	removalCh := &store.MembershipChange{Conv: "g", Ts: 14, Alloc: next}
	go func() {
		_, _, err := st.RemoveMember(ctx, removalCh, "ana")
		removal <- err
	}()
	select {
	case err := <-second:
		t.Fatalf("a second edit of the message did not wait for the first: %v", err)
	case err := <-removal:
		t.Fatalf("the editor's removal did not wait for the edit: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	releaseIt()
	if err := <-first; err != nil {
		t.Fatalf("first edit: %v", err)
	}
	errSecond, errRemoval := <-second, <-removal
	if errRemoval != nil {
		t.Fatalf("removal: %v", errRemoval)
	}
	// The removal may win the race for the lock after the first edit, and
	// then the second edit is refused: either way, in seq order.
	if errSecond == nil && secondCh.Seq <= firstSeq.Load() {
		t.Fatalf("second edit seq %d, first %d", secondCh.Seq, firstSeq.Load())
	}
	if errSecond != nil && !errors.Is(errSecond, store.ErrNotMember) {
		t.Fatalf("second edit: %v", errSecond)
	}
	if removalCh.Seq <= firstSeq.Load() {
		t.Fatalf("removal seq %d, below the edit's %d", removalCh.Seq, firstSeq.Load())
	}
	if errSecond == nil && removalCh.Seq <= secondCh.Seq {
		t.Fatalf("removal seq %d, below the second edit's %d", removalCh.Seq, secondCh.Seq)
	}

	// The message's body is that of its edit with the highest seq.
	pg := pgConn(t, ctx, env)
	var body, lastEdit []byte
	var editedBy int64
	if err := pg.QueryRow(ctx, `SELECT e.body, e.edited_by,
			(SELECT x.body FROM events x WHERE x.conv_key = e.conv_key AND x.target = 2 AND x.kind = $1 ORDER BY x.seq DESC LIMIT 1)
		FROM events e JOIN conversations c ON c.conv_key = e.conv_key WHERE c.conv_id = 'g' AND e.seq = 2`, store.KindEdit).
		Scan(&body, &editedBy, &lastEdit); err != nil {
		t.Fatal(err)
	}
	want, wantSeq := "first", firstSeq.Load()
	if errSecond == nil {
		want, wantSeq = "second", secondCh.Seq
	}
	if string(body) != want || string(lastEdit) != want || editedBy != wantSeq {
		t.Fatalf("message body %q edited_by %d, newest edit %q; want %q from seq %d", body, editedBy, lastEdit, want, wantSeq)
	}
}

// Many edits of one message at once: each gets its own seq, and the
// message ends with the body of the one with the highest seq.
func TestConcurrentEditsOfOneMessage(t *testing.T) {
	t.Parallel()
	env, st, ctx := startStore(t)
	env.Group(t, "g", "ana", "ben") // seq 1
	if res, err := st.InsertMessages(ctx, []store.NewMessage{{Conv: "g", Sender: "ana", Cmid: "m", Body: []byte("m"), Seq: 2, Ts: 2}}, 100); err != nil || res[0].Err != nil {
		t.Fatalf("insert: %+v %v", res, err)
	}
	var counter atomic.Int64
	counter.Store(2)
	alloc := func(context.Context) (int64, error) { return counter.Add(1), nil }
	var wg sync.WaitGroup
	var mu sync.Mutex
	bodies := map[int64]string{}
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprint("edit-", i)
			r, err := st.Edit(ctx, &store.MembershipChange{Conv: "g", Actor: "ana", Ts: int64(10 + i), Alloc: alloc}, 2, []byte(body), 1<<40)
			if err != nil || r.Again {
				t.Errorf("edit %d: %+v %v", i, r, err)
				return
			}
			mu.Lock()
			bodies[r.Seq] = body
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(bodies) != 16 {
		t.Fatalf("%d distinct seqs for 16 edits", len(bodies))
	}
	var top int64
	for seq := range bodies {
		top = max(top, seq)
	}
	pg := pgConn(t, ctx, env)
	var body []byte
	var editedBy int64
	if err := pg.QueryRow(ctx, `SELECT e.body, e.edited_by FROM events e JOIN conversations c ON c.conv_key = e.conv_key
		WHERE c.conv_id = 'g' AND e.seq = 2`).Scan(&body, &editedBy); err != nil {
		t.Fatal(err)
	}
	if editedBy != top || string(body) != bodies[top] {
		t.Fatalf("message: body %q edited_by %d; want %q from seq %d", body, editedBy, bodies[top], top)
	}
}
