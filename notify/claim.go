package notify

import (
	"context"
	"time"
)

// idleLook: a shard with nothing due is looked at again when its next
// job is due, when this process made one of its jobs due earlier, and at
// least this often (for jobs another process queued and could not claim
// itself: it died).
const idleLook = time.Second

// shardLoop claims the shard's due jobs and handles them. While Redis
// fails it backs off (up to a second) and logs the first failure only.
// With nothing due it sleeps until the next job is due, this process
// queues or finishes a job of the shard due before that, or idleLook
// passed, but at least Poll: an idle server does not poll Redis 50 times
// a second per shard.
func (n *Notifier) shardLoop(shard int) {
	defer n.loops.Done()
	const batch = 256
	wait := time.NewTimer(0)
	defer wait.Stop()
	fails := 0
	for {
		select {
		case <-n.stop:
			return
		case <-wait.C:
		case <-n.q.wake[shard]:
			wait.Stop() // (no stale fire is received after Stop)
		}
		if !n.waitHeld() {
			return
		}
		n.q.look[shard].Store(lookNow)
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.Lease/2)
		now := time.Now()
		jobs, next, err := n.q.claim(ctx, shard, now, n.cfg.Lease, batch)
		n.m.claims.Inc()
		if err != nil {
			if fails == 0 {
				n.log.Warn("claiming notification jobs; retrying", "shard", shard, "err", err)
			}
			fails++
		} else {
			fails = 0
			if len(jobs) > 0 {
				n.handle(ctx, jobs)
			}
		}
		cancel()
		var d time.Duration
		switch {
		case fails > 0:
			d = min(n.cfg.Poll<<min(fails, 6), time.Second)
		case len(jobs) == batch:
			d = 0
		default:
			d = idleLook
			if !next.IsZero() {
				d = min(d, next.Sub(now))
			}
			d = max(d, n.cfg.Poll)
		}
		// Changes made while this look ran woke the loop already (the
		// claim may not have seen them); from now on only those due
		// before the next look do.
		n.q.look[shard].Store(time.Now().Add(d).UnixMilli())
		wait.Reset(d)
	}
}

// handle runs claimed jobs by kind.
func (n *Notifier) handle(ctx context.Context, jobs []job) {
	var msgs, recalls, users, devices []*job
	for i := range jobs {
		j := &jobs[i]
		switch j.ID[0] {
		case jobEvent:
			if j.Body.Kind == KindRecall {
				recalls = append(recalls, j)
			} else {
				msgs = append(msgs, j)
			}
		case jobBadgeUser:
			users = append(users, j)
		default:
			devices = append(devices, j)
		}
	}
	var fin []finishedJob
	if len(msgs) > 0 {
		fin = append(fin, n.evaluateMessages(ctx, msgs)...)
	}
	for _, j := range recalls {
		fin = append(fin, n.evaluateRecall(ctx, j))
	}
	for _, j := range users {
		fin = append(fin, n.evaluateBadge(ctx, j))
	}
	if len(devices) > 0 {
		fin = append(fin, n.dispatch(ctx, devices)...)
	}
	if len(fin) > 0 {
		if err := n.q.finish(ctx, fin, n.cfg.Delay, n.keep()); err != nil {
			n.log.Warn("finishing notification jobs; they will be claimed again", "jobs", len(fin), "err", err)
		}
	}
}

// keep is how long the last notification of a (device, conversation) is
// remembered (for collapsing, recalls and badges).
func (n *Notifier) keep() time.Duration { return max(n.cfg.TTL, 24*time.Hour) }

// retryLater finishes j as a retry after d (Redis or PostgreSQL failed).
func retryLater(j *job, d time.Duration) finishedJob {
	return finishedJob{Job: j, Outcome: outcomeRetry, At: time.Now().Add(d)}
}
