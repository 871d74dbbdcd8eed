package batch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/parley-im/parley/test/testenv"
)

// The combiner's queueing, on a run function that records its batches
// (the statements themselves are tested on PostgreSQL in store and in
// the gateway tests): a lone request runs at once; requests arriving
// while the workers are busy go together into the NEXT statement, never
// into one already running; the weight bounds a batch; a caller that gave
// up is dropped; a failed batch is retried request by request so one bad
// request fails only itself; Waited tells when a request last queued.
func TestCombiner(t *testing.T) {
	var mu sync.Mutex
	var batches [][]int
	release := make(chan struct{})
	started := make(chan struct{}, 16)
	b := &Combiner[int, int]{
		Workers: 1, Max: 10, Weight: func(q int) int { return map[bool]int{true: 100, false: 1}[q == 100] },
		Sizes:   prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"}),
		Timeout: 10 * time.Second, Log: slog.New(slog.DiscardHandler),
		Run: func(ctx context.Context, qs []int) ([]int, error) {
			mu.Lock()
			batches = append(batches, slices.Clone(qs))
			mu.Unlock()
			started <- struct{}{}
			<-release
			if slices.Contains(qs, 13) {
				return nil, errors.New("bad request in the batch")
			}
			out := make([]int, len(qs))
			for i, q := range qs {
				out[i] = q * 2
			}
			return out, nil
		},
	}
	type result struct{ q, r int }
	results := make(chan result, 16)
	errs := make(chan error, 16)
	do := func(ctx context.Context, q int) {
		r, err := b.Do(ctx, q)
		if err != nil {
			errs <- err
			return
		}
		results <- result{q, r}
	}
	go do(context.Background(), 1) // runs alone, at once
	<-started
	if w := b.Waited(); !w.IsZero() {
		t.Fatalf("a lone request waited (at %v)", w)
	}
	// While it runs, these queue; 13 makes its statement fail, 100 is too
	// heavy to share one, and the caller of 7 gives up before it runs.
	gaveUp, cancel := context.WithCancel(context.Background())
	go do(gaveUp, 7)
	waitQueued(t, b, 1)
	if w := b.Waited(); time.Since(w) > time.Minute {
		t.Fatalf("a request queued behind a busy worker, but Waited is %v", w)
	}
	for i, q := range []int{2, 3, 13, 100} {
		go do(context.Background(), q)
		waitQueued(t, b, i+2) // in this order
	}
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller that gave up got %v", err)
	}
	close(release) // let every statement run
	got := map[int]int{}
	for range 4 {
		r := <-results
		got[r.q] = r.r
	}
	if err := <-errs; err == nil || err.Error() != "bad request in the batch" {
		t.Fatalf("13 got %v", err)
	}
	if want := map[int]int{1: 2, 2: 4, 3: 6, 100: 200}; !sameMap(got, want) {
		t.Fatalf("results %v, want %v", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	// 1 alone; then 2, 3, 13 together (7 dropped; 100 would pass the
	// weight); that fails, so 2, 3 and 13 alone; then 100.
	want := [][]int{{1}, {2, 3, 13}, {2}, {3}, {13}, {100}}
	if !slices.EqualFunc(batches, want, slices.Equal) {
		t.Fatalf("batches %v, want %v", batches, want)
	}
}

func waitQueued(t *testing.T, b *Combiner[int, int], n int) {
	t.Helper()
	testenv.CheckFor(t, 5*time.Second, time.Millisecond, func() error {
		b.mu.Lock()
		l := len(b.queue)
		b.mu.Unlock()
		if l != n {
			return fmt.Errorf("%d requests queued, want %d", l, n)
		}
		return nil
	})
}

func sameMap(a, b map[int]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
