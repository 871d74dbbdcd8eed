// Package periodic runs a process's background jobs on fixed periods, each
// at its own phase, so that jobs with the same period do not all start
// their work at the same instant. On the 2-core reference machine two
// once-a-second jobs that touched PostgreSQL in the same moment (the
// gateway's held-ack flush and fan-out's dense_seq advance) made the
// inserts committing then take up to 20 ms, and cost about 2 ms of
// send_ok p99 at 10,000 sends/s (docs/operations.md).
package periodic

import "time"

// Run calls f at phase × period after it is called (phase is a fraction
// of the period, 0 ≤ phase < 1), then every period, until stop is closed.
// It returns when stop is closed, without calling f again.
func Run(stop <-chan struct{}, period time.Duration, phase float64, f func()) {
	first := time.NewTimer(time.Duration(phase * float64(period)))
	defer first.Stop()
	select {
	case <-stop:
		return
	case <-first.C:
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		f()
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}
