package conn

import (
	"testing"
	"time"
)

// Shutdown's wait for the tracked goroutines (drain) and their starts are
// ordered even when the starter has nothing else in common with Shutdown:
// an event loop's OnClose, a timer or a commit worker starts one while
// none runs, with no other synchronisation with the goroutine that
// waits (as when Shutdown's ctx ends before gnet stopped the loops). The
// wait lasts as long as a tracked goroutine runs, one started meanwhile
// by a running one is waited for too, and once none runs none starts.
// Run under -race: a sync.WaitGroup here (Add from zero unordered with
// Wait) is a data race.
func TestTrackedGoroutines(t *testing.T) {
	g := &Gateway{}
	release := make(chan struct{})
	started := make(chan struct{})
	starterDone := make(chan struct{})
	// The "event loop": starts a goroutine from none running, and does
	// not synchronise with the test until after drain.
	go func() {
		defer close(starterDone)
		g.goroutine(func() {
			close(started)
			<-release
		})
	}()
	time.Sleep(50 * time.Millisecond) // (not a synchronisation: that is the point)
	drained := g.drain()
	waitFor(t, starterDone, "the starter")

	select {
	case <-drained:
		// The starter came only after drain found none running: its
		// goroutine must not have run.
		select {
		case <-started:
			t.Fatal("a goroutine started after the drain found none running")
		case <-time.After(100 * time.Millisecond):
		}
		return
	default:
	}
	// The usual case: the goroutine runs, and the drain waits for it.
	waitFor(t, started, "the tracked goroutine")
	// One it starts meanwhile (none has ended yet) is waited for too.
	nested := make(chan struct{})
	nestedRan := make(chan struct{})
	g.goroutine(func() {
		close(nestedRan)
		<-nested
	})
	waitFor(t, nestedRan, "the goroutine started while draining")
	close(release)
	select {
	case <-drained:
		t.Fatal("drained while a tracked goroutine still runs")
	case <-time.After(50 * time.Millisecond):
	}
	close(nested)
	waitFor(t, drained, "the drain")

	// None runs: a goroutine started now is not run.
	late := make(chan struct{})
	g.goroutine(func() { close(late) })
	select {
	case <-late:
		t.Fatal("a goroutine started after the drain completed")
	case <-time.After(100 * time.Millisecond):
	}
	if again := g.drain(); again != drained {
		t.Fatal("a second drain returned another channel")
	}
}

// waitFor waits up to 5 s for ch to be closed.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: nothing within 5s", what)
	}
}
