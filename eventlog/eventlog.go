// Package eventlog appends events to conversations and reads them back
// gap-free. It joins the two halves of the write path: seqs come from
// Redis (package seq), events are committed to PostgreSQL (package store)
// in group-committed batches, and only then is the event handed to fan-out
// and the sender answered (in that order, so one sender's messages reach
// fan-out in the order it sent them).
//
// Reading (Sync) never lets a client skip an event: a page stops below the
// first seq that has no committed row, and a seq left empty for longer
// than the hole timeout is fenced off with a hole row, which the unique
// key (conv, seq) makes final (docs/consistency.md).
package eventlog

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/backend"
	"github.com/parley-im/parley/internal/batch"
	"github.com/parley-im/parley/seq"
	"github.com/parley-im/parley/store"
)

// ErrRetries: a seq kept being taken (a counter Redis lost, re-seeded
// while sends of the old counter were in flight); nothing was committed.
// Callers also get store's sentinel errors (ErrNotMember, ErrNotFound,
// ErrCursorAhead, …) and backend failures (package backend).
var ErrRetries = fmt.Errorf("eventlog: seq kept being taken; gave up: %w", backend.ErrUnavailable)

// Message is a send request.
type Message struct {
	Conv   string
	Sender string
	Device string // the sending device (it gets send_ok instead of a push)
	Cmid   string
	Body   []byte
	// Mentions: users the message mentions (at most 50); those who are
	// not current members are dropped when it is stored.
	Mentions []string
}

// SendResult is the outcome of one send.
type SendResult struct {
	Seq int64
	Ts  int64
	Dup bool
	Err error
}

// Committed is an event that was just committed, for fan-out.
type Committed struct {
	store.Event
	Device string // the device that caused it, if any (it is not pushed the event)
	// Members is the conversation's member count at commit (0: unknown).
	// HaveRecipients says Recipients holds the users whose membership
	// periods contain Seq, read in the commit itself (small conversations).
	Members        int64
	Recipients     []string
	HaveRecipients bool
	// Leaving says Users leave right after this event (a ban's update,
	// followed by their leave): their membership periods still hold it,
	// though fan-out's online index dropped them before it was committed.
	Leaving bool
}

// Config tunes the log.
type Config struct {
	HoleTimeout   time.Duration
	CommitBatch   int
	CommitWorkers int
	CommitLinger  time.Duration
	// Timeout bounds the work of a send whose context has no deadline
	// (request_timeout; 0 means defaultTimeout); a send's own deadline
	// bounds its batch otherwise.
	Timeout time.Duration
	// RecipientsBelow: for sends to conversations with fewer members, the
	// commit also reads the recipients (write_fanout_max).
	RecipientsBelow int
	// BatchSizes, if set, observes how many sends each commit carries.
	BatchSizes batch.Observer
	// Stages, if set, observe where sends spend their time (seconds).
	Stages Stages
	// BeforeLeave, if set, runs once a leave was checked, before its seq
	// is allocated, under the conversation's change lock (fan-out removes
	// the leaver's devices from the conversation's online index).
	BeforeLeave func(ctx context.Context, conv, user string) error
	// Removed, if set, tells every process that users left conv, or
	// that their mute or role changed (each calls Forget), right after
	// the change committed and before it is answered, so their
	// membership caches refuse the users' sends at once.
	Removed func(ctx context.Context, conv string, users []string) error
	// Joined, if set, tells every process that convs gained members
	// (they were created, or users joined), right after the change
	// committed, so that what they cache of the member lists (the
	// gateway's, for typing and receipts) is dropped.
	Joined func(ctx context.Context, convs []string) error
	// MemberTTL is how old, at most, the answer of the membership check
	// before a send's seq is allocated may be (memberCache); 0 means
	// defaultMemberTTL.
	MemberTTL time.Duration
	// MemberLookups, if set, count that check's PostgreSQL lookups.
	MemberLookups MemberLookups
}

// MemberLookups count the PostgreSQL lookups of the membership check
// before a send's seq is allocated: the ones a send waited for (Waited: a
// sender not seen within MemberTTL) and the ones made in the background
// for senders who keep sending (Refreshed). Nil fields are not counted.
type MemberLookups struct {
	Waited, Refreshed interface{ Add(float64) }
}

// Stages observe, in seconds: how long each send waited for a commit
// worker (Queue), and how long each batch's lookup of resends (Resends),
// seq allocation (Seq) and PostgreSQL insert and commit (Insert) took.
// Nil fields are not observed.
type Stages struct {
	Queue, Resends, Seq, Insert batch.Observer
}

// Log is the conversation log of one process.
type Log struct {
	// Static after construction.
	st       *store.Store
	seqs     *seq.Allocator
	cfg      Config
	log      *slog.Logger
	onCommit func([]Committed)
	now      func() time.Time

	sends   *batch.Batcher[*pendingSend, SendResult]
	members *memberCache

	// Seqs of failed sends that could not be recorded as holes yet
	// (PostgreSQL was down); fenceLoop retries them.
	fmu       sync.Mutex
	unfenced  map[string][]int64
	nUnfenced int // seqs in unfenced
	stop      chan struct{}
	wg        sync.WaitGroup
}

// defaultTimeout is Config.Timeout's default, request_timeout's.
const defaultTimeout = 10 * time.Second

// fenceTimeout bounds recording a failed batch's seqs as holes. It is
// not the batch's deadline, which may be what made the batch fail; a hole
// not recorded in time is kept for fenceLoop.
const fenceTimeout = time.Second

// maxUnfenced bounds the seqs kept for fenceLoop, over all
// conversations; past it, readers fence them after the hole timeout
// instead.
const maxUnfenced = 100000

type pendingSend struct {
	msg Message
	at  int // its place in its batch, set by commitSends
	// Set by allocate: the seq allocated, or why none was; or, for a
	// resend of a message already stored (dup), the original's seq and
	// ts, and nothing was allocated.
	seq      int64
	allocErr error
	dup      bool
	ts       int64
}

// resendLookupTimeout bounds allocate's lookup of resends. Past it (or on
// any error) the batch's sends are allocated seqs as if none were a
// resend: the insert's unique key still answers a resend with its
// original, only its seq is then left a hole.
const resendLookupTimeout = time.Second

// New starts the group-commit workers. onCommit receives every committed
// event, in commit batches, after its transaction committed and before its
// sender is answered; it must not block for long (queue the work).
func New(st *store.Store, seqs *seq.Allocator, cfg Config, log *slog.Logger, onCommit func([]Committed)) *Log {
	ttl := cfg.MemberTTL
	if ttl <= 0 {
		ttl = defaultMemberTTL
	}
	l := &Log{st: st, seqs: seqs, cfg: cfg, log: log, onCommit: onCommit, now: time.Now,
		members: newMemberCache(st, ttl, cmp.Or(cfg.Timeout, defaultTimeout), cfg.MemberLookups, log)}
	l.sends = batch.New(batch.Config{Workers: cfg.CommitWorkers, Max: cfg.CommitBatch, Queue: cfg.CommitBatch * cfg.CommitWorkers * 4,
		Linger: cfg.CommitLinger, Timeout: cmp.Or(cfg.Timeout, defaultTimeout), Sizes: cfg.BatchSizes, Waits: cfg.Stages.Queue}, l.allocate, l.commitSends)
	l.stop = make(chan struct{})
	l.wg.Add(2)
	go l.fenceLoop()
	go func() {
		defer l.wg.Done()
		l.members.refreshLoop(l.stop)
	}()
	return l
}

// Close stops accepting sends and finishes the queued ones.
func (l *Log) Close() {
	l.sends.Close()
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// Send queues m; done is called exactly once, after m was committed (or
// found to be a duplicate) or failed. A sender who is not a current member
// is refused before any seq is allocated. Sends queued one after another
// get increasing seqs (seqs are allocated in queue order; the commits of
// different batches may then finish in any order). ctx's deadline bounds
// the work done for m, in the batch it shares with other sends.
func (l *Log) Send(ctx context.Context, m Message, done func(SendResult)) {
	if err := l.mayPost(ctx, m.Sender, m.Conv); err != nil {
		done(SendResult{Err: err})
		return
	}
	l.sends.Submit(ctx, &pendingSend{msg: m}, func(r SendResult, err error) {
		if err != nil {
			r = SendResult{Err: err}
		}
		done(r)
	})
}

// mayPost checks, from the membership cache, that user is a current
// member of conv and not muted there: store.ErrNotMember, or
// store.ErrForbidden (store.MutedErr).
func (l *Log) mayPost(ctx context.Context, user, conv string) error {
	st, err := l.members.lookup(ctx, user, conv)
	switch {
	case err != nil:
		return err
	case !st.Member:
		return store.ErrNotMember
	case st.MutedUntil > l.now().UnixMilli():
		return store.MutedErr(st.MutedUntil)
	}
	return nil
}

// allocate is the ordered stage of a batch: it answers the resends of
// messages already stored (one PostgreSQL lookup), then allocates the
// seqs of the other sends in one Redis round trip (one seq_alloc call, an
// INCRBY per conversation). Batches are allocated one at a time in queue
// order, so a connection's sends get increasing seqs even though batches
// commit concurrently. ctx has the batch's deadline.
func (l *Log) allocate(ctx context.Context, items []*pendingSend) {
	start := time.Now()
	fresh := l.answerResends(ctx, items)
	start = batch.ObserveSince(l.cfg.Stages.Resends, start)
	if len(fresh) > 0 {
		l.allocateEach(ctx, fresh)
	}
	batch.ObserveSince(l.cfg.Stages.Seq, start)
}

// answerResends marks the items whose (conv, sender, cmid) is stored
// already as duplicates of the stored message, with its seq and ts, so
// that they allocate nothing, and returns the others (items itself when
// there are none). It reads committed rows, in one statement: a resend of
// a message whose send_ok went out is always found; one racing its
// original's commit is not, and is caught by the insert's unique key
// instead (its seq then left a hole). A failed lookup finds nothing.
func (l *Log) answerResends(ctx context.Context, items []*pendingSend) []*pendingSend {
	keys := make([]store.SendKey, len(items))
	for i, it := range items {
		keys[i] = store.SendKey{Conv: it.msg.Conv, Sender: it.msg.Sender, Cmid: it.msg.Cmid}
	}
	ctx, cancel := context.WithTimeout(ctx, resendLookupTimeout)
	sent, err := l.st.StoredSends(ctx, keys)
	cancel()
	if err != nil {
		l.log.Debug("looking up resends before allocating seqs", "sends", len(items), "err", err)
		return items
	}
	var fresh []*pendingSend
	for i, it := range items {
		if sent[i].Seq == 0 {
			if fresh != nil {
				fresh = append(fresh, it)
			}
			continue
		}
		if fresh == nil {
			fresh = append(make([]*pendingSend, 0, len(items)-1), items[:i]...)
		}
		it.dup, it.seq, it.ts, it.allocErr = true, sent[i].Seq, sent[i].Ts, nil
	}
	if fresh == nil {
		return items
	}
	return fresh
}

// allocateEach sets the seq (or allocErr) of every item. A conversation
// whose allocation failed (it does not exist, or its Redis shard is
// failing over) fails its own sends, and the others go on with the seqs
// they got.
func (l *Log) allocateEach(ctx context.Context, items []*pendingSend) {
	var convs []string
	var counts []int64
	index := map[string]int{}
	for _, it := range items {
		i, ok := index[it.msg.Conv]
		if !ok {
			i = len(convs)
			index[it.msg.Conv] = i
			convs = append(convs, it.msg.Conv)
			counts = append(counts, 0)
		}
		counts[i]++
	}
	first, errs := l.seqs.AllocEach(ctx, convs, counts)
	for _, it := range items {
		i := index[it.msg.Conv]
		if err := errs[i]; err != nil {
			if errors.Is(err, store.ErrNotFound) {
				err = store.ErrNotMember // ids cannot be probed
			}
			it.seq, it.allocErr = 0, err
			continue
		}
		it.seq, it.allocErr = first[i], nil
		first[i]++
	}
}

// commitSends runs one allocated batch: insert (one PostgreSQL
// transaction), then allocate anew and retry the rows whose seq was taken.
// It answers every send (its error in its SendResult).
func (l *Log) commitSends(ctx context.Context, items []*pendingSend) ([]SendResult, error) {
	out := make([]SendResult, len(items))
	for i, it := range items {
		it.at = i
	}
	todo := items
	for attempt := 0; len(todo) > 0; attempt++ {
		if attempt == 5 {
			for _, it := range todo {
				out[it.at] = SendResult{Err: ErrRetries}
			}
			break
		}
		if attempt > 0 {
			l.allocateEach(ctx, todo)
		}
		var retry []*pendingSend
		results, msgs, err := l.insertBatch(ctx, todo)
		if err != nil {
			for _, it := range todo {
				if it.dup { // answered by the lookup: the failed insert was not its
					out[it.at] = SendResult{Seq: it.seq, Ts: it.ts, Dup: true}
					continue
				}
				out[it.at] = SendResult{Err: err}
			}
			l.fenceFailed(msgs)
			break
		}
		reseeded := map[string]bool{}
		committed := make([]Committed, 0, len(results))
		for i, r := range results {
			it := todo[i]
			if errors.Is(r.Err, store.ErrSeqTaken) {
				if !reseeded[it.msg.Conv] {
					reseeded[it.msg.Conv] = true
					if err := l.seqs.Reseed(ctx, it.msg.Conv); err != nil {
						l.log.Warn("re-seeding seq counter", "conv", it.msg.Conv, "err", err)
					}
				}
				retry = append(retry, it)
				continue
			}
			if r.Err == nil && !r.Dup {
				m := msgs[i]
				committed = append(committed, Committed{Device: it.msg.Device, Event: store.Event{
					Conv: m.Conv, Seq: m.Seq, Kind: store.KindMsg, Sender: m.Sender, Cmid: m.Cmid, Body: m.Body, Ts: m.Ts, Mentions: r.Mentions},
					Members: r.Members, Recipients: r.Recipients, HaveRecipients: r.HaveRecipients})
			}
		}
		// Fan-out first, then the senders' answers (given once this
		// returns): a sender that sends its next message on send_ok must
		// not have it pushed before this one (both would be queued for
		// fan-out in the wrong order).
		if len(committed) > 0 && l.onCommit != nil {
			l.onCommit(committed)
		}
		for i, r := range results {
			if !errors.Is(r.Err, store.ErrSeqTaken) {
				out[todo[i].at] = SendResult{Seq: r.Seq, Ts: r.Ts, Dup: r.Dup, Err: r.Err}
			}
		}
		todo = retry
	}
	return out, nil
}

// insertBatch inserts the items that got a seq, in one transaction.
func (l *Log) insertBatch(ctx context.Context, items []*pendingSend) ([]store.InsertResult, []store.NewMessage, error) {
	start := time.Now()
	ts := l.now().UnixMilli()
	results := make([]store.InsertResult, len(items))
	msgs := make([]store.NewMessage, len(items))
	var at []int
	var toInsert []store.NewMessage
	for k, it := range items {
		if it.dup {
			results[k] = store.InsertResult{Seq: it.seq, Ts: it.ts, Dup: true}
			continue
		}
		if it.allocErr != nil {
			results[k].Err = it.allocErr
			continue
		}
		msgs[k] = store.NewMessage{Conv: it.msg.Conv, Sender: it.msg.Sender, Cmid: it.msg.Cmid, Body: it.msg.Body, Seq: it.seq, Ts: ts, Mentions: it.msg.Mentions}
		at = append(at, k)
		toInsert = append(toInsert, msgs[k])
	}
	if len(toInsert) == 0 {
		return results, msgs, nil
	}
	res, err := l.st.InsertMessages(ctx, toInsert, l.cfg.RecipientsBelow)
	batch.ObserveSince(l.cfg.Stages.Insert, start)
	if err != nil {
		return nil, msgs, err
	}
	for j, k := range at {
		results[k] = res[j]
	}
	return results, msgs, nil
}

// fenceFailed records the seqs of a batch that failed as holes, so
// readers move past them at once instead of after the hole timeout. If
// PostgreSQL is down, fenceLoop keeps trying until it is back.
func (l *Log) fenceFailed(msgs []store.NewMessage) {
	byConv := map[string][]int64{}
	for _, m := range msgs {
		if m.Conv != "" {
			byConv[m.Conv] = append(byConv[m.Conv], m.Seq)
		}
	}
	if len(byConv) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), fenceTimeout)
	defer cancel()
	for conv, seqs := range byConv {
		if err := l.st.InsertHoles(ctx, conv, seqs, l.now().UnixMilli()); err != nil {
			l.keepUnfenced(conv, seqs)
		}
	}
}

// keepUnfenced keeps seqs of conv for fenceLoop, up to maxUnfenced in all;
// past that, readers fence them after the hole timeout instead.
func (l *Log) keepUnfenced(conv string, seqs []int64) {
	l.fmu.Lock()
	defer l.fmu.Unlock()
	if l.unfenced == nil {
		l.unfenced = map[string][]int64{}
	}
	if l.nUnfenced+len(seqs) > maxUnfenced {
		return
	}
	l.unfenced[conv] = append(l.unfenced[conv], seqs...)
	l.nUnfenced += len(seqs)
}

// fenceLoop retries the holes fenceFailed could not record.
func (l *Log) fenceLoop() {
	defer l.wg.Done()
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		l.refence(l.takeUnfenced())
	}
}

// takeUnfenced empties the seqs kept for fenceLoop and returns them.
func (l *Log) takeUnfenced() map[string][]int64 {
	l.fmu.Lock()
	defer l.fmu.Unlock()
	pending := l.unfenced
	l.unfenced, l.nUnfenced = nil, 0
	return pending
}

// refence records pending as holes, keeping again what still fails.
func (l *Log) refence(pending map[string][]int64) {
	for conv, seqs := range pending {
		ctx, cancel := context.WithTimeout(context.Background(), fenceTimeout)
		err := l.st.InsertHoles(ctx, conv, seqs, l.now().UnixMilli())
		cancel()
		if err != nil {
			l.keepUnfenced(conv, seqs)
		}
	}
}

// Sync reads user's page of conv after `after` (docs/protocol.md §4 sync).
func (l *Log) Sync(ctx context.Context, conv, user string, after int64, limit int) (store.Page, error) {
	for attempt := 0; ; attempt++ {
		p, err := l.st.ReadPage(ctx, conv, user, after, limit)
		if err != nil {
			return p, err
		}
		if after > p.Head {
			return p, store.ErrCursorAhead
		}
		if p.Gap == 0 || attempt == 8 || l.now().UnixMilli()-p.GapAfterTs < l.cfg.HoleTimeout.Milliseconds() {
			return p, nil
		}
		// A later seq committed more than HoleTimeout ago and this one is
		// still empty: its send failed or its sender died. Fence it.
		if err := l.st.InsertHoles(ctx, conv, []int64{p.Gap}, l.now().UnixMilli()); err != nil {
			return p, err
		}
		l.log.Debug("fenced a hole", "conv", conv, "seq", p.Gap)
	}
}

// Create creates conversations, all of them or none (store.ErrExists,
// store.ErrUnknownUser); each one's join event is seq 1.
func (l *Log) Create(ctx context.Context, cs ...store.NewConversation) error {
	ts := l.now().UnixMilli()
	if err := l.st.CreateConversations(ctx, cs, ts); err != nil {
		return err
	}
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.ID
	}
	l.joined(ctx, ids) // before the joins are pushed
	for i, err := range l.seqs.ReseedMany(ctx, ids) {
		if err != nil {
			l.log.Warn("seeding seq counter", "conv", ids[i], "err", err)
		}
	}
	for _, c := range cs {
		l.committed(store.MembershipChange{Conv: c.ID, Actor: c.Actor, Seq: 1, Ts: ts}, store.KindJoin, c.Members, "", int64(len(c.Members)))
	}
	return nil
}

// AddMembers appends a join event for users (actor "" for the admin API).
// Adding only current members changes nothing and allocates no seq.
func (l *Log) AddMembers(ctx context.Context, conv, actor, device string, users []string) (int64, error) {
	var head, members int64
	var added []string
	err := l.change(ctx, conv, actor, func(ch *store.MembershipChange) (err error) {
		head, members, added, err = l.st.AddMembers(ctx, ch, users)
		return err
	}, func(ch store.MembershipChange) {
		if len(added) > 0 {
			l.joined(ctx, []string{conv})
			l.committed(ch, store.KindJoin, added, device, members)
		}
	})
	return head, err
}

// RemoveMember appends a leave event for user (who left, or was removed
// by actor; "" for the admin API).
func (l *Log) RemoveMember(ctx context.Context, conv, actor, device, user string) (int64, error) {
	var head, members int64
	err := l.change(ctx, conv, actor, func(ch *store.MembershipChange) (err error) {
		head, members, err = l.st.RemoveMember(ctx, ch, user)
		return err
	}, func(ch store.MembershipChange) {
		l.changed(ctx, conv, []string{user})
		l.committed(ch, store.KindLeave, []string{user}, device, members)
	})
	return head, err
}

// beforeLeave is a change's BeforeLeave: the leavers' devices leave the
// online index once the removal was checked and before its seq (or any
// later one) exists.
func (l *Log) beforeLeave(conv string) func(ctx context.Context, users []string) error {
	if l.cfg.BeforeLeave == nil {
		return nil
	}
	return func(ctx context.Context, users []string) error {
		for _, u := range users {
			if err := l.cfg.BeforeLeave(ctx, conv, u); err != nil {
				return err
			}
		}
		return nil
	}
}

// changed drops what every process's membership cache knows of users in
// conv (they left, or their mute or role changed), before the change is
// answered.
func (l *Log) changed(ctx context.Context, conv string, users []string) {
	l.Forget(conv, users)
	if l.cfg.Removed != nil {
		if err := l.cfg.Removed(ctx, conv, users); err != nil {
			l.log.Warn("telling other processes of a membership change", "conv", conv, "err", err)
		}
	}
}

// joined tells every process that convs gained members.
func (l *Log) joined(ctx context.Context, convs []string) {
	if l.cfg.Joined == nil {
		return
	}
	if err := l.cfg.Joined(ctx, convs); err != nil {
		l.log.Warn("telling other processes of new members", "convs", len(convs), "err", err)
	}
}

// Forget drops what the membership cache knows of users in conv (they
// left it, here or in another process).
func (l *Log) Forget(conv string, users []string) {
	for _, u := range users {
		l.members.forget(u, conv)
	}
}

// IsMember reports whether user is a current member of conv (cached for a
// few seconds; the commit checks again).
func (l *Log) IsMember(ctx context.Context, user, conv string) (bool, error) {
	return l.members.isMember(ctx, user, conv)
}

// Recall appends a recall event for the message at target (sent by actor
// within window). Refusals and repeats allocate no seq.
func (l *Log) Recall(ctx context.Context, conv, actor, device string, target int64, window time.Duration) (store.RecallResult, error) {
	var res store.RecallResult
	err := l.change(ctx, conv, actor, func(ch *store.MembershipChange) (err error) {
		res, err = l.st.Recall(ctx, ch, target, window.Milliseconds())
		return err
	}, func(ch store.MembershipChange) {
		if !res.Again && l.onCommit != nil {
			l.onCommit([]Committed{{Device: device, Members: res.Members, Event: store.Event{Conv: conv, Seq: ch.Seq, Kind: store.KindRecall,
				Sender: actor, Ts: ch.Ts, Target: target}}})
		}
	})
	if errors.Is(err, store.ErrNotFound) {
		err = store.ErrNotMember // ids cannot be probed
	}
	return res, err
}

// change runs apply, one change of conv's log that is not a message (a
// membership change, a recall or an edit), and then done if it succeeded. The
// store checks the change under the conversation's change lock and only
// then allocates its seq (store.MembershipChange), so a refused change
// allocates nothing; a seq that turns out to be taken is allocated anew
// after re-seeding the counter, and one left unused by a failure after
// allocation is recorded as a hole at once. An actor who is not a member
// (as the cache says) is refused without asking the store.
func (l *Log) change(ctx context.Context, conv, actor string, apply func(*store.MembershipChange) error, done func(store.MembershipChange)) error {
	if actor != "" {
		if ok, err := l.members.isMember(ctx, actor, conv); err != nil || !ok {
			if err == nil {
				err = store.ErrNotMember
			}
			return err
		}
	}
	for attempt := 0; attempt < 5; attempt++ {
		ch := store.MembershipChange{Conv: conv, Actor: actor, Ts: l.now().UnixMilli(),
			Alloc:       func(ctx context.Context) (int64, error) { return l.seqs.AllocOne(ctx, conv) },
			BeforeLeave: l.beforeLeave(conv)}
		err := apply(&ch)
		switch {
		case err == nil:
			done(ch)
			return nil
		case errors.Is(err, store.ErrSeqTaken):
			if err := l.seqs.Reseed(ctx, conv); err != nil {
				return err
			}
			continue
		case ch.Seq != 0:
			if herr := l.st.InsertHoles(ctx, conv, []int64{ch.Seq}, ch.Ts); herr != nil {
				l.log.Debug("fencing unused seq", "conv", conv, "seq", ch.Seq, "err", herr)
			}
		}
		return err
	}
	return ErrRetries
}

func (l *Log) committed(ch store.MembershipChange, kind store.Kind, users []string, device string, members int64) {
	if l.onCommit == nil {
		return
	}
	l.onCommit([]Committed{{Device: device, Members: members, Event: store.Event{Conv: ch.Conv, Seq: ch.Seq, Kind: kind, Sender: ch.Actor, Ts: ch.Ts, Users: users}}})
}

// Edit appends an edit event for the message at target (sent by actor
// within window), carrying its new body. Refusals and retries (the same
// body as the newest edit) allocate no seq.
func (l *Log) Edit(ctx context.Context, conv, actor, device string, target int64, body []byte, window time.Duration) (store.EditResult, error) {
	var res store.EditResult
	err := l.change(ctx, conv, actor, func(ch *store.MembershipChange) (err error) {
		res, err = l.st.Edit(ctx, ch, target, body, window.Milliseconds())
		return err
	}, func(ch store.MembershipChange) {
		if !res.Again && l.onCommit != nil {
			l.onCommit([]Committed{{Device: device, Members: res.Members, Event: store.Event{Conv: conv, Seq: ch.Seq, Kind: store.KindEdit,
				Sender: actor, Ts: ch.Ts, Target: target, Body: body}}})
		}
	})
	if errors.Is(err, store.ErrNotFound) {
		err = store.ErrNotMember // ids cannot be probed
	}
	return res, err
}
