// Package notify sends notifications to registered devices that are not
// reading (docs/notifications.md): through APNs, FCM or a signed webhook,
// for each committed message a device did not ack within notify_delay,
// collapsed per (device, conversation), with the user's exact unread total
// as the badge, and data-only recall and badge notifications that keep
// phones honest.
//
// Work is durable: committed messages (many to a job) and recalls become
// jobs in a sharded Redis queue (queue.go), due notify_delay after their
// commit; a worker claims due jobs for a lease and finishes them only once the
// provider answered, so the jobs of a worker or process that dies are
// claimed again when their lease ends. Delivery is at least once, with the
// same idempotency key on every attempt; a notification sent again after
// a worker died is counted (parley_notify_duplicated_total).
package notify

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/store"
)

// Config tunes the notifier (docs/config.md, notify_*).
type Config struct {
	Delay    time.Duration // notify_delay: how long a device has to ack before it is notified
	TTL      time.Duration // notify_ttl: how long a notification is retried
	BadgeMax int64         // notify_badge_max
	Preview  bool          // notify_preview
	// Shards is the number of queue shards (Redis hash tags).
	Shards int
	// Lease: a job a worker claimed and did not finish within this is
	// claimed again (the worker is taken for dead).
	Lease time.Duration
	// Timeout bounds one provider request.
	Timeout time.Duration
	// Concurrency is how many requests each provider may have in flight.
	Concurrency int
	// The tier thresholds (the pull tier notifies mentioned users only).
	WriteFanoutMax, OnlineFanoutMax int
	// Prefix is the Redis key prefix.
	Prefix string
	// Poll is the least time between two looks at a shard with nothing
	// due.
	Poll time.Duration
}

// Online returns which of the users' devices are connected (device id →
// true).
type Online func(ctx context.Context, users []string) (map[string]bool, error)

// Notifier turns committed events into notifications.
type Notifier struct {
	// Static after construction.
	st        *store.Store
	rdb       redis.UniversalClient
	q         *queue
	cfg       Config
	log       *slog.Logger
	m         *metrics
	providers map[string]*pool
	online    Online
	// boot prefixes this process's send ids in the devices' gates
	// (gate.go); sends counts them.
	boot  string
	sends atomic.Uint64

	// Events and read advances waiting to be queued (intakeLoop); nil
	// when no provider is configured.
	events chan intake
	reads  chan string
	// Outcomes of provider requests waiting to be recorded (finishLoop).
	results chan result

	// beforeFinish, if set (tests), runs when a provider answered, before
	// the outcome is recorded; false leaves the job unfinished, as if the
	// worker died right then.
	beforeFinish func(j *job, err error) bool

	// held: while set (Hold, tests), shard loops claim nothing until it
	// is closed.
	held atomic.Pointer[chan struct{}]

	stop     chan struct{}
	loops    sync.WaitGroup // intake, shard and backlog loops
	senders  sync.WaitGroup // provider workers
	finisher sync.WaitGroup
	once     sync.Once
}

// pool is one provider with its bounded queue and workers.
type pool struct {
	p     Provider
	tasks chan task
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
func (p *pool) offer(t task, wait *time.Duration, stop <-chan struct{}) bool {
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

type task struct {
	j job
	n Notification
	// fence: the device's fence read before its registration (gate.go);
	// sendID names this attempt in the device's gate.
	fence, sendID string
}

type result struct {
	j        job
	provider string
	token    string
	regAt    int64 // when the device registered token (Unix ms)
	err      error
	// device and sendID: the send's mark in the device's gate, to
	// remove once the outcome is recorded ("": it never entered).
	device, sendID string
}

// New returns a notifier sending through providers (by Name); Start
// starts it.
func New(st *store.Store, rdb redis.UniversalClient, cfg Config, providers []Provider, online Online, log *slog.Logger, reg prometheus.Registerer) *Notifier {
	if cfg.Shards <= 0 {
		cfg.Shards = 8
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 30 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 64
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 20 * time.Millisecond
	}
	n := &Notifier{st: st, rdb: rdb, q: newQueue(rdb, cfg.Prefix, cfg.Shards), cfg: cfg, log: log,
		m: newMetrics(reg), providers: map[string]*pool{}, online: online, boot: newBootID(),
		stop: make(chan struct{})}
	for _, p := range providers {
		n.providers[p.Name()] = &pool{p: p, tasks: make(chan task, cfg.Concurrency*8)}
	}
	if !n.Off() {
		// The intake's buffers are only made when they can be used:
		// together they are a few MiB, which as live heap would raise
		// the garbage collector's goal (and so the resident memory) of
		// a server that sends no notifications.
		n.events = make(chan intake, intakeEvents)
		n.reads = make(chan string, intakeReads)
		n.results = make(chan result, 4096)
	}
	return n
}

// Has reports whether the notifier can send through provider.
func (n *Notifier) Has(provider string) bool { return n.providers[provider] != nil }

// Off reports whether the notifier has no provider to send through. It
// then does nothing at all: committed events and read advances are not
// queued (a registration cannot be made, and one made under an earlier
// configuration could not be sent to), so a server without push
// notifications pays nothing for them per send.
func (n *Notifier) Off() bool { return len(n.providers) == 0 }

// Start starts the workers (none if Off).
func (n *Notifier) Start() {
	if n.Off() {
		n.log.Info("push notifications off: no provider configured")
		return
	}
	for _, p := range n.providers {
		for range n.cfg.Concurrency {
			n.senders.Add(1)
			go n.sendLoop(p)
		}
	}
	n.finisher.Add(1)
	go n.finishLoop()
	n.loops.Add(2 + n.cfg.Shards)
	go n.intakeLoop()
	go n.backlogLoop()
	for s := range n.cfg.Shards {
		go n.shardLoop(s)
	}
}

// Close stops claiming, lets the requests in flight finish and records
// their outcomes. Queued jobs stay in Redis for the next start or another
// process.
func (n *Notifier) Close() {
	n.once.Do(func() {
		close(n.stop)
		n.loops.Wait()
		for _, p := range n.providers {
			close(p.tasks)
		}
		n.senders.Wait()
		if n.results != nil { // nil when off
			close(n.results)
		}
		n.finisher.Wait()
	})
}

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
	var pending []put
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
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := n.q.put(ctx, pending, n.cfg.Delay)
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
func (n *Notifier) eventJob(e intake) put {
	return put{ID: eventJobID(e.Seq, e.Conv), Shard: n.q.shardOf(e.Conv),
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
func (n *Notifier) messageJobs(pending []put, msgs []eventRef) []put {
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

func (n *Notifier) messageJob(refs []eventRef) put {
	first, newest := refs[0], refs[0].ts
	for _, r := range refs[1:] {
		newest = max(newest, r.ts)
	}
	return put{ID: eventJobID(first.Seq, first.Conv), Shard: n.q.shardOf(first.Conv),
		Due: newest + n.cfg.Delay.Milliseconds(), Seq: first.Seq, Ts: newest, Body: jobBody{Kind: KindMsg, Events: refs}}
}

// badgeUserJob: read advances of one user within a short while share one
// job (a reader scrolling through conversations moves it many times).
func (n *Notifier) badgeUserJob(user string) put {
	now := time.Now().UnixMilli()
	wait := min(n.cfg.Delay/10, 500*time.Millisecond).Milliseconds()
	return put{ID: "b|" + user, Shard: n.q.shardOf(user), Due: now + wait, Seq: now, Ts: now, Body: jobBody{User: user}}
}

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
	var fin []done
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
func retryLater(j *job, d time.Duration) done {
	return done{Job: j, Outcome: outcomeRetry, At: time.Now().Add(d)}
}

// msgJobID names the pending notification of (device, conv).
func msgJobID(device, conv string) string {
	return "m|" + strconv.Itoa(len(device)) + ":" + device + conv
}

// evaluateMessages applies the policy to messages whose notify_delay has
// passed: each registered device of each recipient that has not acked a
// message, unless muted and not mentioned, gets it merged into its
// pending notification of the conversation, one update per (device,
// conversation) for all the jobs' messages.
func (n *Notifier) evaluateMessages(ctx context.Context, jobs []*job) []done {
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
	fin := make([]done, 0, len(jobs))
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
	merged := map[pair]*put{}
	var puts []*put
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
			p = &put{ID: msgJobID(t.Reg.Device, r.Conv), Shard: shard, Due: now.Add(n.mergeWindow()).UnixMilli(),
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
	out := make([]put, len(puts))
	for i, p := range puts {
		slices.Sort(p.Seqs)
		p.Seqs = slices.Compact(p.Seqs)
		out[i] = *p
	}
	// In seq order, as messages committed later are merged after
	// earlier ones.
	slices.SortStableFunc(out, func(a, b put) int { return cmp.Compare(a.Seq, b.Seq) })
	if len(out) > 0 {
		if err := n.q.put(ctx, out, n.cfg.Delay); err != nil {
			n.log.Warn("queueing notifications", "err", err)
			for _, j := range jobs {
				fin = append(fin, retryLater(j, time.Second))
			}
			return fin
		}
	}
	for _, j := range jobs {
		fin = append(fin, done{Job: j, Outcome: outcomeDrop, At: now})
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
func (n *Notifier) evaluateRecall(ctx context.Context, j *job) done {
	info, err := n.st.RecallTargets(ctx, j.Body.Conv, j.Seq)
	if errors.Is(err, store.ErrNotFound) {
		return done{Job: j, Outcome: outcomeDrop, At: time.Now()}
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
	var puts []put
	for _, d := range info.Devices {
		if last[d.Device] < info.Target {
			continue // never notified of the recalled message
		}
		puts = append(puts, put{ID: "r|" + strconv.FormatInt(j.Seq, 10) + "|" + strconv.Itoa(len(d.Device)) + ":" + d.Device + j.Body.Conv,
			Shard: j.Shard, Due: now, Seq: j.Seq, Ts: j.Ts, Body: jobBody{Conv: j.Body.Conv, User: d.User, Device: d.Device, Target: info.Target}})
	}
	if len(puts) > 0 {
		if err := n.q.put(ctx, puts, n.cfg.Delay); err != nil {
			return retryLater(j, time.Second)
		}
	}
	return done{Job: j, Outcome: outcomeDrop, At: time.Now()}
}

// notifiedKey is the set of conversations a device was notified of and
// may not have acked since.
func (n *Notifier) notifiedKey(device string) string {
	return n.cfg.Prefix + "notify:{d" + device + "}:convs"
}

// evaluateBadge: the user's read position moved; every registered device
// of theirs that is not connected and was notified of something it has
// not acked since gets a badge notification.
func (n *Notifier) evaluateBadge(ctx context.Context, j *job) done {
	user := j.Body.User
	regs, err := n.st.UserRegistrations(ctx, user)
	if err != nil {
		return retryLater(j, time.Second)
	}
	if len(regs) == 0 {
		return done{Job: j, Outcome: outcomeDrop, At: time.Now()}
	}
	connected := map[string]bool{}
	if n.online != nil {
		if connected, err = n.online(ctx, []string{user}); err != nil {
			return retryLater(j, time.Second)
		}
	}
	now := time.Now().UnixMilli()
	var puts []put
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
		puts = append(puts, put{ID: "g|" + r.Device, Shard: n.q.shardOf(user), Due: now, Seq: now, Ts: now,
			Body: jobBody{User: user, Device: r.Device}})
	}
	if len(puts) > 0 {
		if err := n.q.put(ctx, puts, n.cfg.Delay); err != nil {
			return retryLater(j, time.Second)
		}
	}
	return done{Job: j, Outcome: outcomeDrop, At: time.Now()}
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

// dispatch hands device jobs to their providers: with the current
// registration, the badge of now, and only if still wanted (a message
// notification whose messages the device acked meanwhile is dropped).
func (n *Notifier) dispatch(ctx context.Context, jobs []*job) []done {
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
	fin := make([]done, 0)
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
	wait := map[*pool]time.Duration{} // what is left of each provider's wait
	for _, j := range jobs {
		reg, ok := regs[j.Body.Device]
		if !ok {
			n.m.dropped.WithLabelValues("", "unregistered").Inc()
			fin = append(fin, done{Job: j, Outcome: outcomeDrop, At: now})
			continue
		}
		p := n.providers[reg.Provider]
		if p == nil {
			n.m.dropped.WithLabelValues(reg.Provider, "no_provider").Inc()
			fin = append(fin, done{Job: j, Outcome: outcomeDrop, At: now})
			continue
		}
		if now.Sub(time.UnixMilli(j.Ts)) > n.cfg.TTL {
			n.m.dropped.WithLabelValues(reg.Provider, "expired").Inc()
			fin = append(fin, done{Job: j, Outcome: outcomeDrop, At: now})
			continue
		}
		if j.ID[0] == jobMsg && delivered[store.DeviceConv{Device: j.Body.Device, Conv: j.Body.Conv}] >= j.Seq {
			n.m.skipped.WithLabelValues("acked").Inc()
			fin = append(fin, done{Job: j, Outcome: outcomeDrop, At: now})
			continue
		}
		badge := min(badges[j.Body.User], n.cfg.BadgeMax)
		t := task{j: *j, fence: fences[reg.Device], n: Notification{Device: reg.Device, User: reg.User, Token: reg.Token, Sandbox: reg.Sandbox,
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
			fin = append(fin, done{Job: j, Outcome: outcomeRetry, At: now.Add(time.Second)})
		}
	}
	return fin
}

// sendLoop is one worker of a provider.
func (n *Notifier) sendLoop(p *pool) {
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
		r := result{j: t.j, provider: p.p.Name(), token: t.n.Token, regAt: t.n.RegisteredAt, err: err}
		if entered {
			r.device, r.sendID = t.n.Device, t.sendID
		}
		n.results <- r
	}
}

// finishLoop records the outcomes of provider requests, many per
// pipeline.
func (n *Notifier) finishLoop() {
	defer n.finisher.Done()
	for r := range n.results {
		batch := []result{r}
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
func (n *Notifier) record(batch []result) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Now()
	fin := make([]done, 0, len(batch))
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
			fin = append(fin, done{Job: j, Outcome: outcomeSent, At: now})
			continue
		}
		if errors.Is(r.err, errWithdrawn) {
			// Prepared from a registration withdrawn or replaced since:
			// prepared again now, from what is registered (if anything).
			n.m.skipped.WithLabelValues("withdrawn").Inc()
			fin = append(fin, done{Job: j, Outcome: outcomeRetry, At: now})
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
			fin = append(fin, done{Job: j, Outcome: outcomeDrop, At: now})
		case ReasonRejected:
			n.log.Warn("notification rejected", "provider", r.provider, "device", j.Body.Device, "err", r.err)
			n.m.dropped.WithLabelValues(r.provider, reason).Inc()
			fin = append(fin, done{Job: j, Outcome: outcomeDrop, At: now})
		case ReasonConfig:
			n.configRefused(r.provider, r.err)
			n.m.dropped.WithLabelValues(r.provider, reason).Inc()
			fin = append(fin, done{Job: j, Outcome: outcomeDrop, At: now})
		default:
			at := now.Add(max(backoff(j.Attempts), after))
			if at.Sub(time.UnixMilli(j.Ts)) > n.cfg.TTL {
				n.m.dropped.WithLabelValues(r.provider, "expired").Inc()
				fin = append(fin, done{Job: j, Outcome: outcomeDrop, At: now})
				continue
			}
			fin = append(fin, done{Job: j, Outcome: outcomeRetry, At: at})
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
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if b, err := n.q.backlog(ctx); err == nil {
				n.m.backlog.Set(float64(b))
			}
			cancel()
		}
	}
}
