package notify

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/parley-im/parley/store"
)

// msgJobID names the pending notification of (device, conv).
func msgJobID(device, conv string) string {
	return "m|" + strconv.Itoa(len(device)) + ":" + device + conv
}

// evaluateMessages applies the policy to messages whose notify_delay has
// passed: each registered device of each recipient that has not acked a
// message, unless muted and not mentioned, gets it merged into its
// pending notification of the conversation, one update per (device,
// conversation) for all the jobs' messages.
func (n *Notifier) evaluateMessages(ctx context.Context, jobs []*job) []finishedJob {
	var refs []eventRef
	for _, j := range jobs {
		if len(j.Body.Events) > 0 {
			refs = append(refs, j.Body.Events...)
		} else { // a job of one message
			refs = append(refs, eventRef{Conv: j.Body.Conv, Seq: j.Seq, Members: j.Body.Members})
		}
	}
	evs := make([]store.NotifyEvent, len(refs))
	for i, r := range refs {
		evs[i] = store.NotifyEvent{Conv: r.Conv, Seq: r.Seq, MentionsOnly: r.Members > int64(n.cfg.OnlineFanoutMax)}
	}
	fin := make([]finishedJob, 0, len(jobs))
	targets, err := n.st.NotifyTargets(ctx, evs)
	if err != nil {
		n.log.Warn("reading notification targets", "err", err)
		for _, j := range jobs {
			fin = append(fin, retryLater(j, time.Second))
		}
		return fin
	}
	now := time.Now()
	type pair struct{ device, conv string }
	merged := map[pair]*newJob{}
	var puts []*newJob
	for _, t := range targets {
		r := refs[t.Event]
		if t.Delivered >= r.Seq {
			n.m.skipped.WithLabelValues("acked").Inc()
			continue
		}
		if t.MutedUntil > now.UnixMilli() && !t.Mentioned {
			n.m.skipped.WithLabelValues("muted").Inc()
			continue
		}
		k := pair{t.Reg.Device, r.Conv}
		p := merged[k]
		if p == nil {
			shard := n.q.shardOf(r.Conv)
			p = &newJob{ID: msgJobID(t.Reg.Device, r.Conv), Shard: shard, Due: now.Add(n.mergeWindow()).UnixMilli(),
				Merge: true, Sent: n.q.sentKey(shard, t.Reg.Device, r.Conv)}
			merged[k] = p
			puts = append(puts, p)
		}
		p.Seqs = append(p.Seqs, r.Seq)
		mentioned := p.Body.Mentioned || t.Mentioned
		if r.Seq > p.Seq { // the newest message is the one shown
			p.Seq, p.Ts = r.Seq, t.Ts
			p.Body = jobBody{Conv: r.Conv, User: t.Reg.User, Device: t.Reg.Device, Sender: t.Sender, Title: t.Title}
			if n.cfg.Preview {
				p.Body.Preview = preview(t.Body)
			}
		}
		p.Body.Mentioned = mentioned
	}
	out := make([]newJob, len(puts))
	for i, p := range puts {
		slices.Sort(p.Seqs)
		p.Seqs = slices.Compact(p.Seqs)
		out[i] = *p
	}
	// In seq order, as messages committed later are merged after
	// earlier ones.
	slices.SortStableFunc(out, func(a, b newJob) int { return cmp.Compare(a.Seq, b.Seq) })
	if len(out) > 0 {
		if err := n.q.enqueue(ctx, out, n.cfg.Delay); err != nil {
			n.log.Warn("queueing notifications", "err", err)
			for _, j := range jobs {
				fin = append(fin, retryLater(j, time.Second))
			}
			return fin
		}
	}
	for _, j := range jobs {
		fin = append(fin, finishedJob{Job: j, Outcome: outcomeDrop, At: now})
	}
	return fin
}

// mergeWindow is how long a new notification waits for the messages
// committed right after its first one (whose notify_delay ends a moment
// later), so that a burst makes one notification.
func (n *Notifier) mergeWindow() time.Duration { return min(n.cfg.Delay/10, 50*time.Millisecond) }

// preview is body as UTF-8, cut to 100 characters ("" if it is not text).
func preview(body []byte) string {
	if !utf8.Valid(body) {
		return ""
	}
	s := string(body)
	if utf8.RuneCountInString(s) <= 100 {
		return s
	}
	r := []rune(s)
	return string(r[:100])
}

// evaluateRecall queues a data-only recall notification to each device
// that was notified of the recalled message.
func (n *Notifier) evaluateRecall(ctx context.Context, j *job) finishedJob {
	info, err := n.st.RecallTargets(ctx, j.Body.Conv, j.Seq)
	if errors.Is(err, store.ErrNotFound) {
		return finishedJob{Job: j, Outcome: outcomeDrop, At: time.Now()}
	}
	if err != nil {
		n.log.Warn("reading recall targets", "err", err)
		return retryLater(j, time.Second)
	}
	devices := make([]string, len(info.Devices))
	for i, d := range info.Devices {
		devices[i] = d.Device
	}
	last, err := n.q.lastSent(ctx, j.Shard, j.Body.Conv, devices)
	if err != nil {
		return retryLater(j, time.Second)
	}
	now := time.Now().UnixMilli()
	var puts []newJob
	for _, d := range info.Devices {
		if last[d.Device] < info.Target {
			continue // never notified of the recalled message
		}
		puts = append(puts, newJob{ID: "r|" + strconv.FormatInt(j.Seq, 10) + "|" + strconv.Itoa(len(d.Device)) + ":" + d.Device + j.Body.Conv,
			Shard: j.Shard, Due: now, Seq: j.Seq, Ts: j.Ts, Body: jobBody{Conv: j.Body.Conv, User: d.User, Device: d.Device, Target: info.Target}})
	}
	if len(puts) > 0 {
		if err := n.q.enqueue(ctx, puts, n.cfg.Delay); err != nil {
			return retryLater(j, time.Second)
		}
	}
	return finishedJob{Job: j, Outcome: outcomeDrop, At: time.Now()}
}

// notifiedKey is the set of conversations a device was notified of and
// may not have acked since.
func (n *Notifier) notifiedKey(device string) string {
	return n.cfg.Prefix + "notify:{d" + device + "}:convs"
}

// evaluateBadge: the user's read position moved; every registered device
// of theirs that is not connected and was notified of something it has
// not acked since gets a badge notification.
func (n *Notifier) evaluateBadge(ctx context.Context, j *job) finishedJob {
	user := j.Body.User
	regs, err := n.st.UserRegistrations(ctx, user)
	if err != nil {
		return retryLater(j, time.Second)
	}
	if len(regs) == 0 {
		return finishedJob{Job: j, Outcome: outcomeDrop, At: time.Now()}
	}
	connected := map[string]bool{}
	if n.online != nil {
		if connected, err = n.online(ctx, []string{user}); err != nil {
			return retryLater(j, time.Second)
		}
	}
	now := time.Now().UnixMilli()
	var puts []newJob
	for _, r := range regs {
		if connected[r.Device] {
			continue
		}
		stale, err := n.notifiedUnacked(ctx, r.Device)
		if err != nil {
			return retryLater(j, time.Second)
		}
		if !stale {
			continue
		}
		puts = append(puts, newJob{ID: "g|" + r.Device, Shard: n.q.shardOf(user), Due: now, Seq: now, Ts: now,
			Body: jobBody{User: user, Device: r.Device}})
	}
	if len(puts) > 0 {
		if err := n.q.enqueue(ctx, puts, n.cfg.Delay); err != nil {
			return retryLater(j, time.Second)
		}
	}
	return finishedJob{Job: j, Outcome: outcomeDrop, At: time.Now()}
}

// notifiedUnacked reports whether device was notified of a message it has
// not acked since; conversations it has acked are forgotten.
func (n *Notifier) notifiedUnacked(ctx context.Context, device string) (bool, error) {
	key := n.notifiedKey(device)
	convs, err := n.rdb.SMembers(ctx, key).Result()
	if err != nil || len(convs) == 0 {
		return false, err
	}
	pairs := make([]store.DeviceConv, len(convs))
	for i, c := range convs {
		pairs[i] = store.DeviceConv{Device: device, Conv: c}
	}
	delivered, err := n.st.DeliveredOf(ctx, pairs)
	if err != nil {
		return false, err
	}
	stale := false
	var acked []any
	for _, c := range convs {
		shard := n.q.shardOf(c)
		last, err := n.q.lastSent(ctx, shard, c, []string{device})
		if err != nil {
			return false, err
		}
		if last[device] > delivered[store.DeviceConv{Device: device, Conv: c}] {
			stale = true
		} else {
			acked = append(acked, c)
		}
	}
	if len(acked) > 0 {
		n.rdb.SRem(ctx, key, acked...)
	}
	return stale, nil
}
