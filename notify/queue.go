package notify

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/scripts"
)

// queue is the durable job queue: Shards pairs of Redis keys, a sorted set
// of job ids by the time each is due and a hash of the jobs, each pair
// under a hash tag of its own so a Redis Cluster spreads the shards. A
// worker claims due jobs for a lease (notify_claim); a job is gone only
// when its worker finishes it (notify_done), so the jobs of a worker that
// dies are claimed again when their lease ends. Jobs of one conversation
// share a shard, so a message's job and the (device, conversation)
// notifications it leads to are merged by one script.
type queue struct {
	rdb    redis.UniversalClient
	prefix string
	shards int
	// wake[i] tells shard i's loop that this process made one of its
	// jobs due before the loop meant to look again (put, finish), so
	// that it looks then instead of sleeping until the next job it knew
	// of.
	wake []chan struct{}
	// look[i]: when shard i's loop means to look again (Unix ms);
	// lookNow while it is claiming and handling, when any change may be
	// one its claim did not see.
	look []atomic.Int64
}

// lookNow marks a shard loop at work: every change wakes it.
const lookNow = math.MaxInt64

func newQueue(rdb redis.UniversalClient, prefix string, shards int) *queue {
	q := &queue{rdb: rdb, prefix: prefix, shards: shards, wake: make([]chan struct{}, shards), look: make([]atomic.Int64, shards)}
	for i := range q.wake {
		q.wake[i] = make(chan struct{}, 1)
		q.look[i].Store(lookNow)
	}
	return q
}

// changed wakes the loop of shard if a job of it is now due at due (Unix
// ms) or earlier, before the loop's next look. A loop asleep until a
// later job is not woken for each job put or finished: at a few hundred
// notifications a second that was a claim, a script call, per change.
func (q *queue) changed(shard int, due int64) {
	if due >= q.look[shard].Load() {
		return
	}
	select {
	case q.wake[shard] <- struct{}{}:
	default:
	}
}

// Job kinds (the first letter of a job id).
const (
	jobEvent       = 'e' // a committed msg or recall, to evaluate once notify_delay passed
	jobMsg         = 'm' // a (device, conversation)'s pending msg notification
	jobRecall      = 'r' // a recall notification to one device
	jobBadgeUser   = 'b' // a user's read position moved: which devices need a badge
	jobBadgeDevice = 'g' // a badge notification to one device
)

// job is one claimed job: its id, the fields the scripts keep, and its
// body.
type job struct {
	ID    string
	Shard int
	Seq   int64 // the event's seq; for msg jobs the newest merged
	Count int64 // msg jobs: messages merged
	Ts    int64 // commit ts of the (newest) event, or when the job was made
	// Tries: claims of this job that were not finished; more than 0 at a
	// claim means a worker took it before and died (it may have sent).
	Tries    int64
	Attempts int64 // retries after a provider asked for one
	Body     jobBody
}

// jobBody is the part of a job the scripts do not read.
type jobBody struct {
	Conv      string `json:"c,omitempty"`
	User      string `json:"u,omitempty"`
	Device    string `json:"d,omitempty"`
	Kind      string `json:"k,omitempty"` // event jobs: "msg" or "recall"
	Members   int64  `json:"n,omitempty"` // event jobs: member count at commit
	Sender    string `json:"s,omitempty"`
	Title     string `json:"t,omitempty"`
	Preview   string `json:"p,omitempty"`
	Target    int64  `json:"g,omitempty"` // recall: the recalled seq
	Mentioned bool   `json:"m,omitempty"`
	// Events: an event job's messages (one job per intake round); a job
	// without them is of the one event Conv, its Seq and Members.
	Events []eventRef `json:"e,omitempty"`
}

// eventRef is a committed message an event job holds.
type eventRef struct {
	Conv    string `json:"c"`
	Seq     int64  `json:"s"`
	Members int64  `json:"n,omitempty"` // member count at commit
	ts      int64  // commit time, at intake only (not stored: the job's Ts is the newest)
}

func (q *queue) shardOf(key string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(q.shards))
}

func (q *queue) tag(shard int) string     { return q.prefix + "notify:{n" + strconv.Itoa(shard) + "}:" }
func (q *queue) dueKey(shard int) string  { return q.tag(shard) + "due" }
func (q *queue) jobsKey(shard int) string { return q.tag(shard) + "jobs" }

// sentKey holds the last notification of (device, conv), in conv's shard.
func (q *queue) sentKey(shard int, device, conv string) string {
	return q.tag(shard) + "sent:" + strconv.Itoa(len(device)) + ":" + device + conv
}

// newJob is one job to add (or merge).
type newJob struct {
	ID    string
	Shard int
	Due   int64
	Seq   int64
	Ts    int64
	Body  jobBody
	Merge bool   // a msg job: merge into the pending notification of (device, conv)
	Sent  string // Merge: the sent key of (device, conv)
	// Seqs (Merge, optional): the messages merged at once, ascending,
	// Seq the last; nil: Seq alone.
	Seqs []int64
}

// scriptJobs bounds the jobs of one notify_put or notify_done call: a
// script holds Redis for all of its jobs, and other commands, a send's
// seq among them, wait behind it (BENCHMARKS.md, the row "at 3b7e4a5" on
// a script call's time per job).
const scriptJobs = 64

// byShard calls f with the jobs of each shard, in their order, at most
// scriptJobs at a time.
func byShard[T any](jobs []T, shardOf func(*T) int, f func(shard int, part []*T)) {
	groups := map[int][]*T{}
	var order []int
	for i := range jobs {
		s := shardOf(&jobs[i])
		if _, ok := groups[s]; !ok {
			order = append(order, s)
		}
		g := append(groups[s], &jobs[i])
		if len(g) == scriptJobs {
			f(s, g)
			g = nil
		}
		groups[s] = g
	}
	for _, s := range order {
		if g := groups[s]; len(g) > 0 {
			f(s, g)
		}
	}
}

// enqueue adds jobs in one pipeline, a script call per shard (and per
// scriptJobs); gap is the least time between two notifications of one
// (device, conversation).
func (q *queue) enqueue(ctx context.Context, jobs []newJob, gap time.Duration) error {
	_, err := scripts.RunPipelined(ctx, q.rdb, func(p redis.Pipeliner) {
		byShard(jobs, func(j *newJob) int { return j.Shard }, func(shard int, part []*newJob) {
			keys := make([]string, 2, 2+len(part))
			keys[0], keys[1] = q.dueKey(shard), q.jobsKey(shard)
			args := make([]any, 1, 1+7*len(part))
			args[0] = gap.Milliseconds()
			for _, j := range part {
				b, _ := json.Marshal(j.Body)
				mode, sent, seqs := "new", keys[1], ""
				if j.Merge {
					mode, sent = "merge", j.Sent
					if len(j.Seqs) > 1 {
						buf := make([]byte, 0, 8*len(j.Seqs))
						for i, q := range j.Seqs {
							if i > 0 {
								buf = append(buf, ' ')
							}
							buf = strconv.AppendInt(buf, q, 10)
						}
						seqs = string(buf)
					}
				}
				keys = append(keys, sent)
				args = append(args, j.ID, j.Due, j.Seq, j.Ts, string(b), mode, seqs)
			}
			scripts.NotifyPut.EvalSha(ctx, p, keys, args...)
		})
	})
	for _, j := range jobs {
		q.changed(j.Shard, j.Due)
	}
	return err
}

// claim takes up to n due jobs of shard for lease, and says when the
// shard's next job is due (zero if it has none).
func (q *queue) claim(ctx context.Context, shard int, now time.Time, lease time.Duration, n int) ([]job, time.Time, error) {
	res, err := scripts.NotifyClaim.Run(ctx, q.rdb, []string{q.dueKey(shard), q.jobsKey(shard)},
		now.UnixMilli(), now.Add(lease).UnixMilli(), n).StringSlice()
	if err != nil {
		return nil, time.Time{}, err
	}
	if len(res) == 0 {
		return nil, time.Time{}, fmt.Errorf("notify: claim returned nothing")
	}
	var next time.Time
	if ms, err := strconv.ParseFloat(res[len(res)-1], 64); err == nil {
		next = time.UnixMilli(int64(ms))
	}
	res = res[:len(res)-1]
	jobs := make([]job, 0, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		j, err := parseJob(res[i], res[i+1])
		if err != nil {
			return nil, time.Time{}, err
		}
		j.Shard = shard
		jobs = append(jobs, j)
	}
	return jobs, next, nil
}

func parseJob(id, v string) (job, error) {
	j := job{ID: id}
	parts := strings.SplitN(v, "|", 7)
	if len(parts) != 7 {
		return j, fmt.Errorf("notify: malformed job %q", id)
	}
	nums := []*int64{&j.Seq, &j.Count, &j.Ts, &j.Tries, new(int64), &j.Attempts}
	for i, p := range nums {
		n, err := strconv.ParseInt(parts[i], 10, 64)
		if err != nil {
			return j, fmt.Errorf("notify: malformed job %q: %w", id, err)
		}
		*p = n
	}
	if err := json.Unmarshal([]byte(parts[6]), &j.Body); err != nil {
		return j, fmt.Errorf("notify: malformed job %q: %w", id, err)
	}
	return j, nil
}

// Outcomes of a claimed job (notify_done).
const (
	outcomeSent  = "sent"  // delivered to the provider
	outcomeDrop  = "drop"  // finished without a notification
	outcomeRetry = "retry" // try again at the given time
)

// finishedJob is a claimed job with its outcome: sent, dropped, or
// retried at At.
type finishedJob struct {
	Job     *job
	Outcome string
	At      time.Time // now, or for retry when to try again
}

// finish applies outcomes in one pipeline, a script call per shard (and
// per scriptJobs). gap: the least time between two notifications of one
// (device, conversation); keep: how long the last notification is
// remembered.
func (q *queue) finish(ctx context.Context, ds []finishedJob, gap, keep time.Duration) error {
	_, err := scripts.RunPipelined(ctx, q.rdb, func(p redis.Pipeliner) {
		byShard(ds, func(d *finishedJob) int { return d.Job.Shard }, func(shard int, part []*finishedJob) {
			keys := make([]string, 2, 2+len(part))
			keys[0], keys[1] = q.dueKey(shard), q.jobsKey(shard)
			args := make([]any, 2, 2+5*len(part))
			args[0], args[1] = gap.Milliseconds(), keep.Milliseconds()
			for _, d := range part {
				j := d.Job
				sent := keys[1]
				if j.ID[0] == jobMsg {
					sent = q.sentKey(j.Shard, j.Body.Device, j.Body.Conv)
				}
				keys = append(keys, sent)
				args = append(args, j.ID, j.Seq, j.Count, d.Outcome, d.At.UnixMilli())
			}
			scripts.NotifyDone.EvalSha(ctx, p, keys, args...)
		})
	})
	for _, d := range ds {
		// A job is due again at d.At (a retry), or gap after it (a
		// message merged into it after the claim), or never.
		due := d.At.UnixMilli()
		if d.Outcome != outcomeRetry {
			due += gap.Milliseconds()
		}
		q.changed(d.Job.Shard, due)
	}
	return err
}

// lastSent returns the seq of the last notification of each (device,
// conv) of shard (0: none remembered).
func (q *queue) lastSent(ctx context.Context, shard int, conv string, devices []string) (map[string]int64, error) {
	cmds := make([]*redis.StringCmd, len(devices))
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, d := range devices {
			cmds[i] = p.Get(ctx, q.sentKey(shard, d, conv))
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return nil, err
	}
	out := make(map[string]int64, len(devices))
	for i, c := range cmds {
		v, err := c.Result()
		if err != nil {
			continue
		}
		s, _, _ := strings.Cut(v, "|")
		n, _ := strconv.ParseInt(s, 10, 64)
		out[devices[i]] = n
	}
	return out, nil
}

// backlog counts the jobs of every shard.
func (q *queue) backlog(ctx context.Context) (int64, error) {
	cmds := make([]*redis.IntCmd, q.shards)
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for s := range q.shards {
			cmds[s] = p.HLen(ctx, q.jobsKey(s))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	var n int64
	for _, c := range cmds {
		n += c.Val()
	}
	return n, nil
}
