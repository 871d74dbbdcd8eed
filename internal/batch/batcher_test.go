package batch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/test/testenv"
)

func TestLoneItemRunsAtOnceAndBatchesForm(t *testing.T) {
	var mu sync.Mutex
	var sizes []int
	release := make(chan struct{})
	running := make(chan struct{})
	first := true
	b := New(Config{Workers: 1, Max: 100, Queue: 1000, Linger: 50 * time.Millisecond}, nil, runs(func(items []int) {
		mu.Lock()
		sizes = append(sizes, len(items))
		block := first
		first = false
		mu.Unlock()
		if block {
			close(running)
			<-release // hold the worker so the next items queue up
		}
	}))
	start := time.Now()
	if err := submit(b, context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	<-running
	for i := 1; i <= 10; i++ {
		_ = submit(b, context.Background(), i)
	}
	// The former takes queued items into the next batch while the worker
	// is held.
	testenv.CheckFor(t, 5*time.Second, time.Millisecond, func() error {
		if n := len(b.ch); n == 10 {
			return fmt.Errorf("the former has taken none of the %d queued items", n)
		}
		return nil
	})
	close(release)
	b.Close()
	heldThenBatched(t, sizes, 11)
	// The lone first item did not linger; the second (queued) batch was
	// full-queue drained without waiting the whole linger either.
	if d := time.Since(start); d > 45*time.Millisecond {
		t.Fatalf("took %s: an idle worker lingered", d)
	}
}

// heldThenBatched checks the batch sizes of a run where a lone item held
// the only worker while the others (total in all) were submitted: the
// lone item ran alone; of the others, the former may have formed one
// batch from the first arrivals while the worker was held, and the rest
// formed a single batch once it was free.
func heldThenBatched(t *testing.T, sizes []int, total int) {
	t.Helper()
	sum := 0
	for _, n := range sizes {
		sum += n
	}
	if len(sizes) < 2 || len(sizes) > 3 || sizes[0] != 1 || sum != total {
		t.Fatalf("batch sizes %v: want 1, then the other %d items in one or two batches", sizes, total-1)
	}
}

// Batches that are not full run on at most workers workers; full ones (a
// backlog) may use half as many again.
func TestFullBatchesUseExtraWorkers(t *testing.T) {
	for _, tc := range []struct {
		name      string
		max, want int
	}{{"partial", 100, 2}, {"full", 1, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			var flight inFlight
			b := New(Config{Workers: 2, Max: tc.max, Queue: 1000}, nil, runs(func(items []int) { flight.run(20 * time.Millisecond) }))
			for i := 0; i < 6; i++ {
				if err := submit(b, context.Background(), i); err != nil {
					t.Fatal(err)
				}
				time.Sleep(2 * time.Millisecond) // pacing, on purpose: one item per batch
			}
			b.Close()
			if most := flight.max(); most != tc.want {
				t.Fatalf("at most %d batches ran at once, want %d", most, tc.want)
			}
		})
	}
}

func TestCloseRunsQueuedAndRefusesNew(t *testing.T) {
	var mu sync.Mutex
	n := 0
	b := New(Config{Workers: 2, Max: 4, Queue: 100, Linger: time.Millisecond}, nil, runs(func(items []int) {
		mu.Lock()
		n += len(items)
		mu.Unlock()
	}))
	for i := 0; i < 50; i++ {
		if err := submit(b, context.Background(), i); err != nil {
			t.Fatal(err)
		}
	}
	b.Close()
	b.Close() // twice is fine
	if n != 50 {
		t.Fatalf("ran %d of 50", n)
	}
	if err := submit(b, context.Background(), 1); err != ErrClosed {
		t.Fatalf("submit after close: %v", err)
	}
}

// Eight submitters, one per key: prepare sees each key's items in the
// order they were submitted, while the batches themselves run
// concurrently (at some point two are running at once).
func TestPreparesInSubmitOrderAndRunsConcurrently(t *testing.T) {
	var order keyOrder
	var flight inFlight
	b := New(Config{Workers: 4, Max: 3, Queue: 1000, Linger: time.Millisecond}, func(_ context.Context, items [][2]int) {
		// Preparing takes a random while (a Redis round trip): were
		// batches prepared concurrently, a later one would often finish
		// first. The sleep is that work.
		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		order.see(t, items, "prepared")
	}, runs(func(items [][2]int) {
		flight.run(time.Duration(len(items)) * 100 * time.Microsecond)
	}))
	var wg sync.WaitGroup
	for k := 0; k < 8; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for v := 1; v <= 200; v++ {
				if err := submit(b, context.Background(), [2]int{k, v}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.Close()
	order.endedAt(t, 8, 200)
	if most := flight.max(); most < 2 {
		t.Fatalf("at most %d batch ran at a time, want concurrent batches", most)
	}
}

func TestShardedRunsSameKeyInOrder(t *testing.T) {
	var order keyOrder
	b := NewSharded(Config{Workers: 4, Max: 3, Queue: 1000, Linger: time.Millisecond}, runs(func(items [][2]int) {
		time.Sleep(time.Duration(len(items)) * 100 * time.Microsecond) // the batch's work
		order.see(t, items, "ran")
	}))
	for v := 1; v <= 200; v++ {
		for k := 0; k < 8; k++ {
			b.Submit(context.Background(), uint64(k), [2]int{k, v}, func(_ struct{}, err error) {
				if err != nil {
					t.Error(err)
				}
			})
		}
	}
	b.Close()
	order.endedAt(t, 8, 200)
}

// keyOrder checks that items [key, value] are seen in increasing value
// order per key.
type keyOrder struct {
	mu   sync.Mutex
	last map[int]int // key -> last value seen
}

func (o *keyOrder) see(t *testing.T, items [][2]int, verb string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.last == nil {
		o.last = map[int]int{}
	}
	for _, it := range items {
		if it[1] <= o.last[it[0]] {
			t.Errorf("key %d: %d %s after %d", it[0], it[1], verb, o.last[it[0]])
		}
		o.last[it[0]] = it[1]
	}
}

// endedAt checks that keys 0..keys-1 were all seen up to value v.
func (o *keyOrder) endedAt(t *testing.T, keys, v int) {
	t.Helper()
	for k := 0; k < keys; k++ {
		if o.last[k] != v {
			t.Fatalf("key %d ended at %d", k, o.last[k])
		}
	}
}

// inFlight counts the batches running at once and the most seen.
type inFlight struct {
	mu            sync.Mutex
	running, most int
}

// run counts a batch that takes d.
func (f *inFlight) run(d time.Duration) {
	f.mu.Lock()
	f.running++
	f.most = max(f.most, f.running)
	f.mu.Unlock()
	time.Sleep(d) // the batch's work
	f.mu.Lock()
	f.running--
	f.mu.Unlock()
}

func (f *inFlight) max() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.most
}

type observed struct {
	mu sync.Mutex
	vs []float64
}

func (o *observed) Observe(v float64) {
	o.mu.Lock()
	o.vs = append(o.vs, v)
	o.mu.Unlock()
}

// Every batch's size and every item's wait from Submit to the start of its
// batch are observed: here the first item holds the only worker for 20 ms,
// so the items queued behind it wait at least about that long.
func TestObservesSizesAndWaits(t *testing.T) {
	var sizes, waits observed
	release := make(chan struct{})
	running := make(chan struct{})
	first := true
	b := New(Config{Workers: 1, Max: 100, Queue: 1000, Sizes: &sizes, Waits: &waits}, nil, runs(func(items []int) {
		if first {
			first = false
			close(running)
			<-release
		}
	}))
	ctx := context.Background()
	if err := submit(b, ctx, 0); err != nil {
		t.Fatal(err)
	}
	<-running // the first batch is running
	for i := 1; i <= 5; i++ {
		if err := submit(b, ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond) // on purpose: the queued items wait 20 ms
	close(release)
	b.Close()
	var ns []int
	for _, v := range sizes.vs {
		ns = append(ns, int(v))
	}
	heldThenBatched(t, ns, 6)
	if len(waits.vs) != 6 {
		t.Fatalf("%d waits observed, want 6", len(waits.vs))
	}
	for _, w := range waits.vs[1:] {
		if w < 0.015 {
			t.Fatalf("waits %v: the queued items waited at least 20 ms", waits.vs)
		}
	}
}

// runs makes f, which answers nothing, a Run.
func runs[Q any](f func([]Q)) Run[Q, struct{}] {
	return func(_ context.Context, qs []Q) ([]struct{}, error) {
		f(qs)
		return make([]struct{}, len(qs)), nil
	}
}

// submit submits q and returns the error that kept it from being queued
// (ctx's, or ErrClosed): those are answered before Submit returns, and
// an answer from a run comes later.
func submit[Q any](b *Batcher[Q, struct{}], ctx context.Context, q Q) error {
	var refused error
	var submitting atomic.Bool // runs answer nil errors, from other goroutines
	submitting.Store(true)
	b.Submit(ctx, q, func(_ struct{}, err error) {
		if submitting.Load() && err != nil {
			refused = err
		}
	})
	submitting.Store(false)
	return refused
}

// A batch runs under the latest deadline of its requests; a request
// without one counts as arriving with the batcher's Timeout. Every
// request gets its own answer, and a failed run answers all of them.
func TestBatchRunsUnderItsRequestsDeadline(t *testing.T) {
	got := make(chan time.Duration, 4)
	release := make(chan struct{})
	preparing := make(chan struct{})
	first := true
	hold := func(context.Context, []int) { // the former, so that the next requests queue
		if first {
			first = false
			close(preparing)
			<-release
		}
	}
	b := New(Config{Workers: 1, Max: 10, Queue: 10, Timeout: time.Hour}, hold, func(ctx context.Context, qs []int) ([]int, error) {
		d, ok := ctx.Deadline()
		if !ok {
			t.Error("a batch ran without a deadline")
		}
		got <- time.Until(d)
		if qs[0] < 0 {
			return nil, errors.New("refused")
		}
		out := make([]int, len(qs))
		for i, q := range qs {
			out[i] = q * 10
		}
		return out, nil
	})
	answers := make(chan [2]int, 8)
	var fails atomic.Int32
	give := func(q int) func(int, error) {
		return func(r int, err error) {
			if err != nil {
				fails.Add(1)
				return
			}
			answers <- [2]int{q, r}
		}
	}
	b.Submit(context.Background(), 0, give(0)) // no deadline: the Timeout
	<-preparing
	short, cancel1 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel1()
	long, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	b.Submit(short, 1, give(1))
	b.Submit(long, 2, give(2))
	close(release)
	if d := <-got; d < 59*time.Minute {
		t.Fatalf("a request without a deadline ran with %s left, want the Timeout (1 h)", d)
	}
	if d := <-got; d < 15*time.Second || d > 20*time.Second {
		t.Fatalf("a batch of requests with 2 s and 20 s left ran with %s, want the later (20 s)", d)
	}
	want := map[int]int{0: 0, 1: 10, 2: 20}
	for range 3 {
		a := <-answers
		if want[a[0]] != a[1] {
			t.Fatalf("request %d answered %d, want %d", a[0], a[1], want[a[0]])
		}
	}
	// A run's error answers every request of its batch.
	b.Submit(context.Background(), -1, give(-1))
	b.Close()
	if fails.Load() != 1 {
		t.Fatalf("%d failures, want the one of the failed run", fails.Load())
	}
	// A request whose context is done is not queued: it is answered with
	// its context's error before Submit returns.
	gone, cancel3 := context.WithCancel(context.Background())
	cancel3()
	ran := false
	idle := New(Config{Workers: 1, Max: 1, Queue: 1, Timeout: time.Second}, nil, func(ctx context.Context, qs []int) ([]int, error) {
		ran = true
		return qs, nil
	})
	var err error
	idle.Submit(gone, 1, func(_ int, e error) { err = e })
	idle.Close()
	if !errors.Is(err, context.Canceled) || ran {
		t.Fatalf("a request submitted with a done context: answered %v, ran %v", err, ran)
	}
}
