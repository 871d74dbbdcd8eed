package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/parley-im/parley/store"
)

// MergeCursors checks an ack in full (epoch, membership, head) unless the
// caller vouches for the seq (Known), and then checks only the epoch; an
// old install's ack is refused either way, and a reinstall starts the
// device's cursors from 0.
func TestMergeCursorsKnownAndChecked(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, _ := bucketStore(t, ctx, 2)
	if err := st.CreateUsers(ctx, []string{"ana", "ben", "cy"}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateDevices(ctx, []store.Device{{ID: "b1", User: "ben", TokenSHA256: make([]byte, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateConversation(ctx, store.MembershipChange{Conv: "g", Seq: 1, Ts: 1}, "group", "", []string{"ana", "ben"}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateConversation(ctx, store.MembershipChange{Conv: "other", Seq: 1, Ts: 1}, "group", "", []string{"ana", "cy"}); err != nil {
		t.Fatal(err)
	}
	var msgs []store.NewMessage
	for seq := int64(2); seq <= 10; seq++ {
		msgs = append(msgs, store.NewMessage{Conv: "g", Sender: "ana", Seq: seq, Ts: seq})
	}
	if _, err := st.InsertMessages(ctx, msgs, 0); err != nil {
		t.Fatal(err)
	}
	ack := func(epoch, seq int64, known bool, conv string) store.CursorResult {
		t.Helper()
		res, err := st.MergeCursors(ctx, []store.CursorUpdate{{Device: "b1", User: "ben", Conv: conv, Epoch: epoch, Seq: seq, Known: known}})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	delivered := func() int64 {
		t.Helper()
		page, err := st.Conversations(ctx, "ben", "b1", 10, nil, store.ConvOrder{})
		if err != nil || len(page.Items) != 1 {
			t.Fatalf("conversations: %+v %v", page, err)
		}
		return page.Items[0].Delivered
	}

	// Both paths merge; the full one refuses what it must.
	for _, step := range []struct {
		seq   int64
		known bool
		want  int64
		err   error
	}{{4, true, 4, nil}, {3, true, 4, nil}, {6, false, 6, nil}, {11, false, 0, store.ErrCursorAhead}, {8, true, 8, nil}} {
		if r := ack(0, step.seq, step.known, "g"); r.Delivered != step.want || !errors.Is(r.Err, step.err) {
			t.Fatalf("ack %d (known %v): %+v, want %d %v", step.seq, step.known, r, step.want, step.err)
		}
	}
	if r := ack(0, 1, false, "other"); !errors.Is(r.Err, store.ErrNotMember) {
		t.Fatalf("ack of a conversation never joined: %+v", r)
	}
	if r := ack(1, 9, true, "g"); !errors.Is(r.Err, store.ErrStaleInstall) {
		t.Fatalf("ack of an epoch the device never had: %+v", r)
	}

	// A reinstall: the old install's acks are refused on both paths, and
	// the new install's cursor starts from 0.
	if e, err := st.Reinstall(ctx, "b1"); err != nil || e != 1 {
		t.Fatalf("reinstall: %d %v", e, err)
	}
	if d := delivered(); d != 0 {
		t.Fatalf("delivered %d after the reinstall, want 0", d)
	}
	if r := ack(0, 9, false, "g"); !errors.Is(r.Err, store.ErrStaleInstall) {
		t.Fatalf("checked ack of the old install: %+v", r)
	}
	if r := ack(0, 10, true, "g"); !errors.Is(r.Err, store.ErrStaleInstall) {
		t.Fatalf("ack of the old install: %+v", r)
	}
	if r := ack(1, 2, true, "g"); r.Err != nil || r.Delivered != 2 {
		t.Fatalf("the new install's first ack: %+v, want delivered 2", r)
	}
	if d := delivered(); d != 2 {
		t.Fatalf("delivered %d, want 2", d)
	}
	if r := ack(1, 5, false, "g"); r.Err != nil || r.Delivered != 5 {
		t.Fatalf("the new install's ack: %+v, want delivered 5", r)
	}
	// One batch of both kinds: acks of one cursor merge first (the largest
	// decides how it is checked), and each gets its own answer. The
	// largest ack of g is above head: it is refused, and the smaller ones
	// are merged without it (a bad ack does not take good ones down).
	res, err := st.MergeCursors(ctx, []store.CursorUpdate{
		{Device: "b1", User: "ben", Conv: "g", Epoch: 1, Seq: 7, Known: true},
		{Device: "b1", User: "ben", Conv: "g", Epoch: 1, Seq: 12},
		{Device: "b1", User: "ben", Conv: "other", Epoch: 1, Seq: 1, Known: false},
		{Device: "b1", User: "ben", Conv: "g", Epoch: 1, Seq: 6, Known: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []store.CursorResult{{Delivered: 7}, {Err: store.ErrCursorAhead}, {Err: store.ErrNotMember}, {Delivered: 7}} {
		if res[i].Delivered != want.Delivered || !errors.Is(res[i].Err, want.Err) {
			t.Errorf("mixed batch, ack %d: %+v, want %+v", i, res[i], want)
		}
	}
	if d := delivered(); d != 7 {
		t.Fatalf("delivered %d after the mixed batch, want 7", d)
	}
	res, err = st.MergeCursors(ctx, []store.CursorUpdate{
		{Device: "b1", User: "ben", Conv: "g", Epoch: 1, Seq: 9},
		{Device: "b1", User: "ben", Conv: "g", Epoch: 1, Seq: 9, Known: true},
		{Device: "b1", User: "ben", Conv: "g", Epoch: 1, Seq: 3, Known: true},
	})
	if err != nil || res[0].Delivered != 9 || res[1].Delivered != 9 || res[2].Delivered != 9 {
		t.Fatalf("merged batch: %+v %v, want 9 for each", res, err)
	}
}
