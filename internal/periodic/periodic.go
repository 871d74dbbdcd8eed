// Package periodic runs a process's background jobs on fixed periods, each
// at its own phase, so that jobs with the same period do not all start
// their work at the same instant. Two once-a-second jobs that touched
// PostgreSQL in the same moment (the gateway's held-ack flush and
// fan-out's dense_seq advance) held up the inserts committing then, and
// that showed in send_ok p99 (BENCHMARKS.md, the rows "1e07127…2ba6ac0"
// and "2ba6ac0 against 1e07127").
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
