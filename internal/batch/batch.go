// Package batch serves many callers' requests of one kind with one
// statement, pipeline or transaction: group commit for writes, combined
// reads for reads. Both have one shape: a request is a Q, its answer an R,
// and a Run takes a batch of requests and returns one answer per request,
// in order, or one error for them all. The package gathers the requests,
// runs the batch, and hands each caller its answer.
//
// A batch runs under the deadline of the requests in it: the latest of
// their contexts' deadlines (a request without one counts as arriving with
// the Timeout of the batcher), so a request's own timeout bounds the work
// done for it, and no caller is failed earlier than its own deadline
// because it shared a batch.
//
// Two ways in:
//   - Batcher (and Sharded): asynchronous, for the gateway's event loops.
//     Submit queues a request and calls done with its answer later. One
//     goroutine forms batches in submit order and can prepare each (seq
//     allocation) before the next is formed; workers run them
//     concurrently.
//   - Combiner: synchronous. Do waits for the answer; while a few
//     statements run, the requests that arrive queue up and go into the
//     next one together.
package batch

import (
	"context"
	"fmt"
	"time"
)

// Run answers a batch of requests: one answer per request, in order, or
// an error that answers them all.
type Run[Q, R any] func(ctx context.Context, qs []Q) ([]R, error)

// Observer takes one measurement (prometheus.Observer fits).
type Observer interface{ Observe(float64) }

// ObserveSince gives o (if not nil) the seconds since start, and returns
// the time now, for timing consecutive stages.
func ObserveSince(o Observer, start time.Time) time.Time {
	now := time.Now()
	if o != nil {
		o.Observe(now.Sub(start).Seconds())
	}
	return now
}

// deadlineOf is when a request submitted at now with ctx must be
// answered: ctx's deadline, or now + timeout if it has none.
func deadlineOf(ctx context.Context, now time.Time, timeout time.Duration) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return now.Add(timeout)
}

// answer hands each of n requests its answer: rs[i], or err for all.
func answer[R any](n int, rs []R, err error, give func(i int, r R, err error)) {
	var zero R
	if err == nil && len(rs) != n {
		err = fmt.Errorf("batch: %d answers for %d requests", len(rs), n)
	}
	for i := 0; i < n; i++ {
		if err != nil {
			give(i, zero, err)
		} else {
			give(i, rs[i], nil)
		}
	}
}
