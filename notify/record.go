package notify

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"
)

// providerAnswer is what a provider answered to one send attempt, to be
// recorded (record).
type providerAnswer struct {
	j        job
	provider string
	token    string
	regAt    int64 // when the device registered token (Unix ms)
	err      error
	// device and sendID: the send's mark in the device's gate, to
	// remove once the outcome is recorded ("": it never entered).
	device, sendID string
}

// finishLoop records the outcomes of provider requests, many per
// pipeline.
func (n *Notifier) finishLoop() {
	defer n.finisher.Done()
	for r := range n.results {
		batch := []providerAnswer{r}
		linger := time.NewTimer(recordLinger)
	more:
		for len(batch) < 512 {
			select {
			case r, ok := <-n.results:
				if !ok {
					break more
				}
				batch = append(batch, r)
			case <-linger.C:
				break more
			}
		}
		linger.Stop()
		n.record(batch)
	}
}

// recordLinger: an outcome is recorded at most this long after its
// provider answered, so that a trickle of answers shares a pipeline
// (and a script call per shard) instead of making one each. The
// notification is out already; only a worker dying within it would
// send it again.
const recordLinger = 10 * time.Millisecond

// record finishes the jobs of batch by their outcomes.
func (n *Notifier) record(batch []providerAnswer) {
	ctx, cancel := context.WithTimeout(context.Background(), n.storeTimeout())
	defer cancel()
	now := time.Now()
	fin := make([]finishedJob, 0, len(batch))
	var notified []*job
	for i := range batch {
		r := &batch[i]
		j := &r.j
		if r.err == nil {
			n.m.sent.WithLabelValues(r.provider).Inc()
			if j.Tries > 0 {
				n.m.duplicated.WithLabelValues(r.provider).Inc()
			}
			if j.ID[0] == jobMsg {
				n.m.latency.WithLabelValues(r.provider).Observe(now.Sub(time.UnixMilli(j.Ts)).Seconds())
				notified = append(notified, j)
			}
			fin = append(fin, finishedJob{Job: j, Outcome: outcomeSent, At: now})
			continue
		}
		if errors.Is(r.err, errWithdrawn) {
			// Prepared from a registration withdrawn or replaced since:
			// prepared again now, from what is registered (if anything).
			n.m.skipped.WithLabelValues("withdrawn").Inc()
			fin = append(fin, finishedJob{Job: j, Outcome: outcomeRetry, At: now})
			continue
		}
		reason, after := reasonOf(r.err)
		n.m.failed.WithLabelValues(r.provider, reason).Inc()
		switch reason {
		case ReasonBadToken:
			if _, err := n.st.DropNotifyToken(ctx, j.Body.Device, r.token, r.regAt); err != nil {
				n.log.Warn("removing a registration with a bad token", "device", j.Body.Device, "err", err)
				fin = append(fin, retryLater(j, time.Second))
				continue
			}
			n.m.dropped.WithLabelValues(r.provider, reason).Inc()
			fin = append(fin, finishedJob{Job: j, Outcome: outcomeDrop, At: now})
		case ReasonRejected:
			n.log.Warn("notification rejected", "provider", r.provider, "device", j.Body.Device, "err", r.err)
			n.m.dropped.WithLabelValues(r.provider, reason).Inc()
			fin = append(fin, finishedJob{Job: j, Outcome: outcomeDrop, At: now})
		case ReasonConfig:
			n.configRefused(r.provider, r.err)
			n.m.dropped.WithLabelValues(r.provider, reason).Inc()
			fin = append(fin, finishedJob{Job: j, Outcome: outcomeDrop, At: now})
		default:
			at := now.Add(max(backoff(j.Attempts), after))
			if at.Sub(time.UnixMilli(j.Ts)) > n.cfg.TTL {
				n.m.dropped.WithLabelValues(r.provider, "expired").Inc()
				fin = append(fin, finishedJob{Job: j, Outcome: outcomeDrop, At: now})
				continue
			}
			fin = append(fin, finishedJob{Job: j, Outcome: outcomeRetry, At: at})
		}
	}
	if err := n.q.finish(ctx, fin, n.cfg.Delay, n.keep()); err != nil {
		n.log.Warn("recording notification outcomes; the jobs will be claimed again", "jobs", len(fin), "err", err)
	}
	// The sends leave their devices' gates (withdrawals wait for that),
	// and which conversations each device was notified of is kept, for
	// badges (an empty pipeline sends nothing).
	_, err := n.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		n.leave(ctx, p, batch)
		for _, j := range notified {
			k := n.notifiedKey(j.Body.Device)
			p.SAdd(ctx, k, j.Body.Conv)
			p.PExpire(ctx, k, n.keep())
		}
		return nil
	})
	if err != nil {
		n.log.Debug("recording sends ended and notified conversations (a withdrawal waits for the marks to expire)", "err", err)
	}
}

// backoff is the wait before retry number attempt+1: 1 s doubling to at
// most 5 minutes, with jitter.
func backoff(attempt int64) time.Duration {
	d := time.Second << min(attempt, 8)
	d = min(d, 5*time.Minute)
	return d/2 + rand.N(d/2+1)
}

// backlogLoop samples the queue length each second.
func (n *Notifier) backlogLoop() {
	defer n.loops.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), n.storeTimeout())
			if b, err := n.q.backlog(ctx); err == nil {
				n.m.backlog.Set(float64(b))
			}
			cancel()
		}
	}
}
