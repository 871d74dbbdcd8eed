package notify

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/store"
)

// providerQueue is one provider with its bounded queue of send
// attempts and the workers that make them.
type providerQueue struct {
	p     Provider
	tasks chan sendAttempt
	// stuckUntil (Unix ns): the queue stayed full for a whole
	// providerWait lately; until then dispatch does not wait for room.
	stuckUntil atomic.Int64
	// configLogged (Unix ns): when a configuration error was last logged.
	configLogged atomic.Int64
}

// providerWait bounds how long one dispatch waits for room in a full
// provider queue before it retries the rest of that provider's jobs a
// second later; a provider that made it wait so long is not waited for
// again for providerStuck. A full queue usually means the workers are
// busy, not stuck: waiting for them lets the claim loop keep the pace
// of the provider instead of claiming, preparing and putting back jobs
// it cannot hand over yet; a hanging provider delays the other
// providers' notifications of one batch by providerWait at most.
const (
	providerWait  = 250 * time.Millisecond
	providerStuck = time.Second
)

// offer hands t to the provider's queue: at once if there is room,
// otherwise after waiting for room until the wait budget *wait runs out
// (the time waited is taken from it). It reports whether t was queued.
func (p *providerQueue) offer(t sendAttempt, wait *time.Duration, stop <-chan struct{}) bool {
	select {
	case p.tasks <- t:
		return true
	default:
	}
	now := time.Now()
	if *wait <= 0 || now.UnixNano() < p.stuckUntil.Load() {
		return false
	}
	timer := time.NewTimer(*wait)
	defer timer.Stop()
	select {
	case p.tasks <- t:
		*wait -= time.Since(now)
		return true
	case <-timer.C:
		*wait = 0
		p.stuckUntil.Store(time.Now().Add(providerStuck).UnixNano())
		return false
	case <-stop:
		*wait = 0
		return false
	}
}

// sendAttempt is one notification handed to a provider: the job it
// comes from and what is sent.
type sendAttempt struct {
	j job
	n Notification
	// fence: the device's fence read before its registration (gate.go);
	// sendID names this attempt in the device's gate.
	fence, sendID string
}

// dispatch hands device jobs to their providers: with the current
// registration, the badge of now, and only if still wanted (a message
// notification whose messages the device acked meanwhile is dropped).
func (n *Notifier) dispatch(ctx context.Context, jobs []*job) []finishedJob {
	var devices, users []string
	var pairs []store.DeviceConv
	seenU := map[string]bool{}
	for _, j := range jobs {
		devices = append(devices, j.Body.Device)
		if !seenU[j.Body.User] {
			seenU[j.Body.User] = true
			users = append(users, j.Body.User)
		}
		if j.ID[0] == jobMsg {
			pairs = append(pairs, store.DeviceConv{Device: j.Body.Device, Conv: j.Body.Conv})
		}
	}
	fin := make([]finishedJob, 0)
	// The fences first: a withdrawal committed after they were read
	// stops these sends at the gate (gate.go).
	fences, err := n.fences(ctx, devices)
	var regs map[string]store.Registration
	if err == nil {
		regs, err = n.st.NotifyRegistrations(ctx, devices)
	}
	var delivered map[store.DeviceConv]int64
	var badges map[string]int64
	if err == nil && len(pairs) > 0 {
		delivered, err = n.st.DeliveredOf(ctx, pairs)
	}
	if err == nil {
		badges, err = n.st.UnreadTotals(ctx, users)
	}
	if err != nil {
		n.log.Warn("preparing notifications", "err", err)
		for _, j := range jobs {
			fin = append(fin, retryLater(j, time.Second))
		}
		return fin
	}
	now := time.Now()
	wait := map[*providerQueue]time.Duration{} // what is left of each provider's wait
	for _, j := range jobs {
		reg, ok := regs[j.Body.Device]
		if !ok {
			n.m.dropped.WithLabelValues("", "unregistered").Inc()
			fin = append(fin, finishedJob{Job: j, Outcome: outcomeDrop, At: now})
			continue
		}
		p := n.providers[reg.Provider]
		if p == nil {
			n.m.dropped.WithLabelValues(reg.Provider, "no_provider").Inc()
			fin = append(fin, finishedJob{Job: j, Outcome: outcomeDrop, At: now})
			continue
		}
		if now.Sub(time.UnixMilli(j.Ts)) > n.cfg.TTL {
			n.m.dropped.WithLabelValues(reg.Provider, "expired").Inc()
			fin = append(fin, finishedJob{Job: j, Outcome: outcomeDrop, At: now})
			continue
		}
		if j.ID[0] == jobMsg && delivered[store.DeviceConv{Device: j.Body.Device, Conv: j.Body.Conv}] >= j.Seq {
			n.m.skipped.WithLabelValues("acked").Inc()
			fin = append(fin, finishedJob{Job: j, Outcome: outcomeDrop, At: now})
			continue
		}
		badge := min(badges[j.Body.User], n.cfg.BadgeMax)
		t := sendAttempt{j: *j, fence: fences[reg.Device], n: Notification{Device: reg.Device, User: reg.User, Token: reg.Token, Sandbox: reg.Sandbox,
			RegisteredAt: reg.RegisteredAt, Conv: j.Body.Conv, Seq: j.Seq, Badge: badge, Ts: j.Ts}}
		switch j.ID[0] {
		case jobMsg:
			t.n.Kind, t.n.Sender, t.n.Count, t.n.Title, t.n.Preview = KindMsg, j.Body.Sender, j.Count, j.Body.Title, j.Body.Preview
			t.n.Key = reg.Device + ":" + j.Body.Conv + ":" + strconv.FormatInt(j.Seq, 10)
		case jobRecall:
			t.n.Kind, t.n.Target = KindRecall, j.Body.Target
			t.n.Key = reg.Device + ":" + j.Body.Conv + ":" + strconv.FormatInt(j.Seq, 10)
		default:
			t.n.Kind, t.n.Conv, t.n.Seq = KindBadge, "", 0
			t.n.Key = reg.Device + "::badge-" + strconv.FormatInt(j.Seq, 10)
		}
		w, ok := wait[p]
		if !ok {
			w = providerWait
		}
		queued := p.offer(t, &w, n.stop)
		wait[p] = w
		if !queued {
			// The provider is far behind (slow or hanging): try later,
			// without holding up the other providers.
			n.m.deferred.WithLabelValues(reg.Provider).Inc()
			fin = append(fin, finishedJob{Job: j, Outcome: outcomeRetry, At: now.Add(time.Second)})
		}
	}
	return fin
}

// sendLoop is one worker of a provider.
func (n *Notifier) sendLoop(p *providerQueue) {
	defer n.senders.Done()
	for t := range p.tasks {
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.Timeout)
		t.sendID = n.newSendID()
		err := n.enter(ctx, &t)
		entered := err == nil
		if entered {
			err = p.p.Send(ctx, &t.n)
		}
		cancel()
		if n.beforeFinish != nil && !n.beforeFinish(&t.j, err) {
			continue
		}
		r := providerAnswer{j: t.j, provider: p.p.Name(), token: t.n.Token, regAt: t.n.RegisteredAt, err: err}
		if entered {
			r.device, r.sendID = t.n.Device, t.sendID
		}
		n.results <- r
	}
}
