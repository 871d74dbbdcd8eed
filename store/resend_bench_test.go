package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/parley-im/parley/store"
)

// BenchmarkStoredSends is what the send path's lookup of resends costs a
// batch (eventlog looks a batch's (conv, sender, cmid)s up before
// allocating its seqs): StoredSends of keys that were never stored (the
// common case: every send is new), next to InsertMessages of batches of
// the same size, the statement the lookup precedes. 100 conversations
// hold 1,000 messages each, so the probes descend a real index.
//
//	go test -run '^$' -bench StoredSends -benchtime 2000x ./store/
func BenchmarkStoredSends(b *testing.B) {
	const convs, perConv = 100, 1000
	env := newStoreFix(b, 4, 10*time.Minute) // users ana, ben and cy
	st, ctx := env.st, env.ctx
	seqs := make([]int64, convs)
	conv := func(i int) string { return fmt.Sprint("g", i) }
	for i := range convs {
		seqs[i] = env.Group(b, conv(i), "ana", "ben")
	}
	cmid := 0
	batch := func(n int) []store.NewMessage {
		msgs := make([]store.NewMessage, n)
		for j := range msgs {
			cmid++
			c := cmid % convs
			seqs[c]++
			msgs[j] = store.NewMessage{Conv: conv(c), Sender: "ana", Cmid: fmt.Sprintf("%032x", cmid), Body: make([]byte, 100), Seq: seqs[c], Ts: 1}
		}
		return msgs
	}
	for range convs * perConv / 500 {
		if _, err := st.InsertMessages(ctx, batch(500), 200); err != nil {
			b.Fatal(err)
		}
	}
	for _, n := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("lookup/n=%d", n), func(b *testing.B) {
			keys := make([]store.SendKey, n)
			for b.Loop() {
				for j := range keys {
					cmid++
					keys[j] = store.SendKey{Conv: conv(cmid % convs), Sender: "ana", Cmid: fmt.Sprintf("%032x", cmid)}
				}
				sent, err := st.StoredSends(ctx, keys)
				if err != nil || len(sent) != n || sent[0].Seq != 0 {
					b.Fatal(sent, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/send")
		})
		b.Run(fmt.Sprintf("insert/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				msgs := batch(n)
				b.StartTimer()
				if _, err := st.InsertMessages(ctx, msgs, 200); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/send")
		})
	}
}
