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
//
// A notification's way through the files, in order: intake.go turns
// committed events and read advances into queued jobs; queue.go holds
// them in Redis; claim.go claims due jobs shard by shard; evaluate.go
// decides which devices get what; dispatch.go hands each device's
// notification to its provider (apns.go, fcm.go, webhook.go), with the
// device's gate (gate.go) fencing withdrawn addresses; record.go records
// the providers' answers and finishes or retries the jobs.
package notify

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

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
	// StoreTimeout bounds each batch's work against Redis and PostgreSQL:
	// queueing committed messages, recording outcomes (request_timeout;
	// 10 s if unset).
	StoreTimeout time.Duration
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
	providers map[string]*providerQueue
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
	results chan providerAnswer

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
		m: newMetrics(reg), providers: map[string]*providerQueue{}, online: online, boot: newBootID(),
		stop: make(chan struct{})}
	for _, p := range providers {
		n.providers[p.Name()] = &providerQueue{p: p, tasks: make(chan sendAttempt, cfg.Concurrency*8)}
	}
	if !n.Off() {
		// The intake's buffers are only made when they can be used:
		// together they are a few MiB, which as live heap would raise
		// the garbage collector's goal (and so the resident memory) of
		// a server that sends no notifications.
		n.events = make(chan intake, intakeEvents)
		n.reads = make(chan string, intakeReads)
		n.results = make(chan providerAnswer, 4096)
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
