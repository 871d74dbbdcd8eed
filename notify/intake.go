package notify

import (
	"cmp"
	"context"
	"strconv"
	"time"

	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/store"
)

// The intake's capacity: events (messages and recalls) and read advances
// waiting to be queued. Beyond it they are dropped and counted.
const (
	intakeEvents = 65536
	intakeReads  = 16384
)

// intake is what the intake keeps of a committed message or recall: the
// event job's reference to it, and what a recall's job needs besides.
type intake struct {
	eventRef
	Kind   store.Kind
	Target int64
}

// Committed takes committed events (the conversation log's commit hook):
// messages and recalls are queued for evaluation once notify_delay has
// passed. It never blocks: if the intake is full the event is dropped and
// counted.
func (n *Notifier) Committed(evs []eventlog.Committed) {
	if n.Off() {
		return
	}
	for _, e := range evs {
		if e.Kind != store.KindMsg && e.Kind != store.KindRecall {
			continue
		}
		select {
		case n.events <- intake{eventRef: eventRef{Conv: e.Conv, Seq: e.Seq, Members: e.Members, ts: e.Ts}, Kind: e.Kind, Target: e.Target}:
		default:
			n.m.dropped.WithLabelValues("", "intake_full").Inc()
		}
	}
}

// ReadAdvanced implements conn.Notifications: the user's devices that
// were notified and are not connected get a new badge.
func (n *Notifier) ReadAdvanced(user string) {
	if n.Off() {
		return
	}
	select {
	case n.reads <- user:
	default:
		n.m.dropped.WithLabelValues("", "intake_full").Inc()
	}
}

// intakeLoop queues events and read advances, many per pipeline.
func (n *Notifier) intakeLoop() {
	defer n.loops.Done()
	var pending []newJob
	var msgs []eventRef // messages taken this round: they share jobs
	take := func(e intake) {
		if e.Kind == store.KindRecall {
			pending = append(pending, n.eventJob(e))
			return
		}
		msgs = append(msgs, e.eventRef)
	}
	intakeFails := 0
	for {
		var stopping bool
		select {
		case e := <-n.events:
			take(e)
		case u := <-n.reads:
			pending = append(pending, n.badgeUserJob(u))
		case <-n.stop:
			stopping = true
		}
	more: // take whatever else is queued (all of it when stopping)
		for stopping || (len(pending) < 512 && len(msgs) < 4096) {
			select {
			case e := <-n.events:
				take(e)
			case u := <-n.reads:
				pending = append(pending, n.badgeUserJob(u))
			default:
				break more
			}
		}
		pending = n.messageJobs(pending, msgs)
		msgs = msgs[:0]
		if len(pending) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), n.storeTimeout())
			err := n.q.enqueue(ctx, pending, n.cfg.Delay)
			cancel()
			if err == nil {
				pending, intakeFails = pending[:0], 0
			} else {
				if intakeFails == 0 {
					n.log.Warn("queueing notification jobs; retrying", "jobs", len(pending), "err", err)
				}
				intakeFails++
				if len(pending) > 100000 {
					n.m.dropped.WithLabelValues("", "intake_full").Add(float64(len(pending)))
					pending = pending[:0]
				}
				if !stopping {
					select {
					case <-time.After(min(100*time.Millisecond<<min(intakeFails, 4), time.Second)):
					case <-n.stop:
					}
				}
			}
		}
		if stopping {
			return
		}
	}
}

// eventJob is a recall's job.
func (n *Notifier) eventJob(e intake) newJob {
	return newJob{ID: eventJobID(e.Seq, e.Conv), Shard: n.q.shardOf(e.Conv),
		Due: e.ts + n.cfg.Delay.Milliseconds(), Seq: e.Seq, Ts: e.ts,
		Body: jobBody{Conv: e.Conv, Kind: KindRecall, Members: e.Members, Target: e.Target}}
}

// eventsPerJob bounds the messages of one event job.
const eventsPerJob = 256

// eventJobID names an event job after its (first) event.
func eventJobID(seq int64, conv string) string { return "e|" + strconv.FormatInt(seq, 10) + "|" + conv }

// messageJobs appends to pending the jobs of msgs: per
// shard of their conversations, a job per eventsPerJob messages, named
// after its first message and due notify_delay after its newest commit.
// One job per intake round and shard instead of one per message keeps the
// queue's work per message small (the recipients are evaluated per claim
// anyway), and a conversation's messages stay in its shard, whose loop
// evaluates them in commit order, as notification counts need.
func (n *Notifier) messageJobs(pending []newJob, msgs []eventRef) []newJob {
	groups := make([][]eventRef, n.cfg.Shards)
	for _, m := range msgs {
		s := n.q.shardOf(m.Conv)
		if len(groups[s]) == eventsPerJob {
			pending = append(pending, n.messageJob(groups[s]))
			groups[s] = nil
		}
		groups[s] = append(groups[s], m)
	}
	for _, refs := range groups {
		if len(refs) > 0 {
			pending = append(pending, n.messageJob(refs))
		}
	}
	return pending
}

func (n *Notifier) messageJob(refs []eventRef) newJob {
	first, newest := refs[0], refs[0].ts
	for _, r := range refs[1:] {
		newest = max(newest, r.ts)
	}
	return newJob{ID: eventJobID(first.Seq, first.Conv), Shard: n.q.shardOf(first.Conv),
		Due: newest + n.cfg.Delay.Milliseconds(), Seq: first.Seq, Ts: newest, Body: jobBody{Kind: KindMsg, Events: refs}}
}

// badgeUserJob: read advances of one user within a short while share one
// job (a reader scrolling through conversations moves it many times).
func (n *Notifier) badgeUserJob(user string) newJob {
	now := time.Now().UnixMilli()
	wait := min(n.cfg.Delay/10, 500*time.Millisecond).Milliseconds()
	return newJob{ID: "b|" + user, Shard: n.q.shardOf(user), Due: now + wait, Seq: now, Ts: now, Body: jobBody{User: user}}
}

// storeTimeout bounds each batch's work against the stores
// (Config.StoreTimeout).
func (n *Notifier) storeTimeout() time.Duration { return cmp.Or(n.cfg.StoreTimeout, 10*time.Second) }
