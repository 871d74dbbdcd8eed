package periodic

import (
	"sync"
	"testing"
	"time"
)

// TestRunPhaseAndPeriod: the first call comes phase × period after the
// start, the next ones a period apart, and none after stop.
func TestRunPhaseAndPeriod(t *testing.T) {
	const period = 100 * time.Millisecond
	start := time.Now()
	stop := make(chan struct{})
	var mu sync.Mutex
	var at []time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(stop, period, 0.5, func() {
			mu.Lock()
			at = append(at, time.Since(start))
			mu.Unlock()
		})
	}()
	time.Sleep(380 * time.Millisecond) // on purpose, the window under test: calls at ~50, 150, 250, 350 ms
	close(stop)
	<-done
	stopped := time.Since(start)
	time.Sleep(2 * period) // on purpose: no call may come after Run returned
	mu.Lock()
	defer mu.Unlock()
	// Timers only ever fire late, so the bounds that must hold are the
	// lower ones (and the count, which lateness can only lower).
	if len(at) < 2 || len(at) > 4 {
		t.Fatalf("calls at %v, want 2 to 4 (at ~50, 150, 250, 350 ms)", at)
	}
	for k, a := range at {
		if earliest := period/2 + time.Duration(k)*period - time.Millisecond; a < earliest {
			t.Fatalf("call %d at %v, before %v (half a period, then one per period)", k, a, earliest)
		}
	}
	if last := at[len(at)-1]; last > stopped {
		t.Fatalf("a call at %v, after Run returned at %v", last, stopped)
	}
}

// TestRunStopsBeforeTheFirstCall: stop during the phase wait returns
// without calling f.
func TestRunStopsBeforeTheFirstCall(t *testing.T) {
	stop := make(chan struct{})
	close(stop)
	Run(stop, time.Hour, 0.5, func() { t.Fatal("f called after stop") })
}
