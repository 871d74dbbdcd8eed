// Package loadtest is Parley's load generator (cmd/parley-load): it
// provisions its own users, devices and conversations on any running
// Parley through the admin API's bulk forms, under a run prefix no other
// run shares, connects real client connections (client.Conn), and drives
// open-loop load: sends are scheduled by the clock at a target rate, never
// by the previous reply, and every latency is measured from the send's
// intended start time, so a stalled server cannot hide its stall
// (coordinated omission). It checks delivery exactly (every confirmed send
// pushed exactly once to every other online member device), records HDR
// histograms, and reports server CPU per send beside throughput.
//
// A scenario (direct, group, large, idle, storm, mixed) is a
// function over a runner, which offers the building blocks: provision,
// connect, pace, drain, report.
package loadtest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds of every run.
const (
	MaxDuration = 10 * time.Minute
	MaxRate     = 1_000_000
	MaxPairs    = 100_000
	MaxBodySize = 65536
	MaxSources  = 254
	MaxConns    = 200_000   // connections of one run (idle, storm, group, large online)
	MaxMembers  = 1_000_000 // members of the large scenario's group
	// MaxDevicesPerUser bounds the mixed scenario's -devices-per-user.
	MaxDevicesPerUser = 8
	// DefaultMaxInflight caps the sends waiting for a reply across the run;
	// a send due beyond it is not made and counts as CLIENT_BACKLOG.
	DefaultMaxInflight = 1_000_000
)

// ClientMode is how sends travel.
type ClientMode string

const (
	// ClientPipe writes send frames through a per-connection writer that
	// coalesces whatever is due into one write, and matches replies by rid
	// itself (client.Conn only authenticates and reads).
	ClientPipe ClientMode = "pipe"
	// ClientDo calls client.Conn.Send (Do) from one goroutine per send.
	ClientDo ClientMode = "do"
)

// LiveMode is how the once-a-second progress line is written.
type LiveMode int

const (
	LiveOff   LiveMode = iota // no live line
	LiveLines                 // one line per second (a pipe or a file)
	LiveTTY                   // one line rewritten in place (a terminal)
)

// Config is one run. Zero values take the defaults noted.
type Config struct {
	Scenario   string        // "direct"
	Addr       string        // gateway host:port
	AdminURL   string        // http://host:port of the admin API
	AdminToken string        // bearer token of the admin API
	Rate       float64       // target sends per second, aggregate (required)
	Duration   time.Duration // length of the send window (default 10s, at most MaxDuration)
	Drain      time.Duration // after the window, wait for replies and pushes until none arrived for this long (default 3s; 60 s in all at most)
	// Warmup (direct, group, large, mixed): send at Rate this long before the
	// window, then wait for its replies and pushes; latencies, rates and
	// CPU count only the window, lost and duplicated count both.
	Warmup      time.Duration
	Sources     int            // dial from 127.0.0.1 … 127.0.0.N (default 1)
	AllowRemote bool           // allow a non-loopback Addr / AdminURL
	ServerPID   int            // if > 0, report the server's CPU per send
	CPUPIDs     map[string]int // more processes (with their descendants) to report CPU for, by name
	Client      ClientMode     // default ClientPipe
	Transport   string         // "tcp" (default) or "ws": WebSocket to ws://Addr/v1/ws (every scenario but storm)
	AckDelay    time.Duration  // each device acks its conversations' cursors at most this often, like client.Client's AutoAck (default 50ms; negative: never)
	MaxInflight int64          // default DefaultMaxInflight
	Prefix      string         // id prefix of this run (default: random)

	// Scenario direct.
	Pairs int // pairs of users, one device each (default 100)
	// Phones (direct): each user also has a phone, a device registered
	// for notifications with the tool's webhook sink and never connected
	// (see NotifySink); the connected devices register too.
	Phones   bool
	BodySize int // message body bytes, at least 8 (default 100)

	// Scenario group: Groups groups of Size members, one device each.
	// Scenario storm: conversations of Size members (default 5).
	// Scenario mixed: Groups groups of Size members drawn at random from
	// its users (default Users / Size, so a user is in about one group;
	// negative: no groups).
	Groups int // default 50 (group), Users / Size (mixed)
	Size   int // default 20 (group, mixed), 5 (storm)
	// GroupOnline (scenario group): members of each group that have a
	// device and connect; the others are offline members. 0: all.
	GroupOnline int

	// Scenario large: one group of Members members, Online of them
	// connected, Senders of those sending.
	Members int // default 10000
	Online  int // default 2000
	Senders int // default 10
	// Moderate, if above 0, adds a moderator to scenario large: an online
	// member that does not send, made the group's owner, which mutes and
	// removes offline members, alternately, this many times a second
	// (moderate.go). 0: none.
	Moderate float64

	// Scenario idle: Conns connections that authenticate and ping every
	// PingInterval for Duration; the server's RSS is read from
	// /proc/ServerPID/status or from MetricsURL.
	Conns        int           // default 1000
	PingInterval time.Duration // default 30s
	MetricsURL   string        // http://host:port of the server's metrics listener (/metrics)

	// Scenario storm: Devices devices, each a member of ConvsPer
	// conversations (of Size members) holding Msgs messages each; all
	// drop at once and reconnect at once, each with auth and one snapshot.
	Devices  int // default 2000
	ConvsPer int // default 3
	Msgs     int // default 5
	// JWTSecret or JWTKeyFile (storm): the devices authenticate with JWTs
	// signed with this HS256 secret, or with this PEM private key (RSA:
	// RS256, ECDSA P-256: ES256, Ed25519: EdDSA), instead of admin-made
	// devices and static tokens; every login is a device's first, so the
	// server provisions them (jwt_auto_provision). See runStorm.
	JWTSecret  string
	JWTKeyFile string

	// Scenario mixed: Users users with DevicesPerUser devices each on
	// average (each user ⌊D⌋ or ⌈D⌉, spread evenly), every user in
	// Directs direct conversations, plus the groups above. A send goes
	// from a random user to one of its conversations from one of its
	// devices. A device that is pushed a message reads the conversation
	// (a `read` up to the newest seq it was pushed) with probability
	// ReadProb, ReadDelay (±50 %) later; while one read of a
	// conversation is scheduled on a device, later pushes only raise
	// its seq.
	Users          int           // default 1000
	DevicesPerUser float64       // default 1.6, 1 to MaxDevicesPerUser
	Directs        int           // direct conversations per user (default 4; negative: none)
	ReadProb       float64       // default 0.3; negative: never read
	ReadDelay      time.Duration // default 1s; negative: read at once
	// Message features in mixed (features.go): a typing frame before a
	// send (TypingProb, default 0.5), an edit after a send_ok (EditProb,
	// default 0.02), a clear after a read_ok of a single-device user
	// (ClearProb, default 0.02), a receipts query after a read_ok of a
	// direct conversation (ReceiptsProb, default 0.05); negative: never.
	// NoFeatures turns all of them off.
	TypingProb, EditProb, ClearProb, ReceiptsProb float64
	NoFeatures                                    bool

	// Probes beside any scenario that sends (docs/loadtest.md, "Probes"):
	// ProbePostgres, a PostgreSQL URL, runs a bare commit probe (one row
	// per transaction into a table of its own) and reports the WAL written
	// per confirmed send (pg_stat_wal); ProbeRedis, a Redis URL, runs a
	// PING probe. Each runs at ProbeRate a second (default 200).
	ProbePostgres string
	ProbeRedis    string
	ProbeRate     float64

	// Scenario notify (docs/loadtest.md): Groups groups of one sender
	// (Senders devices, default 20) and Size receivers drawn from Users
	// receivers, registered with the server's webhook, which must be
	// NotifySink (the tool listens there) signing with NotifySecret;
	// NotifyDelay is the server's notify_delay.
	NotifySink   string        // default 127.0.0.1:9099
	NotifySecret string        // "" skips the signature check
	NotifyDelay  time.Duration // default 3s

	Out  io.Writer // live line and notes (nil: discarded)
	Live LiveMode

	// dropEvery, in tests, makes the tool ignore every n-th push, as if
	// the network had lost it, to exercise the hint → sync repair.
	dropEvery int64
	// notifyAcked, in tests of scenario notify, is called once the load
	// is over, while the acking receivers go on acking, with the acks
	// they owe; the scenario waits for it before waiting for the
	// notifications (an error fails the run).
	notifyAcked func(ctx context.Context, owed []ackOwed) error
}

func (c *Config) setDefaults() {
	if c.ProbeRate == 0 {
		c.ProbeRate = 200
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Drain == 0 {
		c.Drain = 3 * time.Second
	}
	if c.Sources == 0 {
		c.Sources = 1
	}
	if c.Client == "" {
		c.Client = ClientPipe
	}
	if c.AckDelay == 0 {
		c.AckDelay = 50 * time.Millisecond
	}
	if c.MaxInflight == 0 {
		c.MaxInflight = DefaultMaxInflight
	}
	if c.Pairs == 0 {
		c.Pairs = 100
	}
	if c.Size == 0 {
		c.Size = 20
		if c.Scenario == "storm" || c.Scenario == "typing" {
			c.Size = 5
		}
	}

	if c.Users == 0 {
		c.Users = 1000
	}
	if c.Scenario == "notify" {
		if c.Groups == 0 {
			c.Groups = 2000
		}
		if c.Senders == 0 {
			c.Senders = 20
		}
	}
	if c.Scenario == "notify" || c.Phones {
		if c.NotifySink == "" {
			c.NotifySink = "127.0.0.1:9099"
		}
		if c.NotifyDelay == 0 {
			c.NotifyDelay = 3 * time.Second
		}
	}
	if c.Devices == 0 {
		c.Devices = 2000
	}
	if c.Groups == 0 {
		c.Groups = 50
		switch c.Scenario {
		case "mixed":
			c.Groups = max(1, c.Users/max(c.Size, 1))
		case "typing":
			// Each device in 20 groups: at 10,000 frames/s from 2,000
			// devices it types in each every 4 s, under the relay's limit.
			c.Groups = max(1, c.Devices*20/max(c.Size, 1))
		}
	}
	if c.DevicesPerUser == 0 {
		c.DevicesPerUser = 1.6
	}
	if c.Directs == 0 {
		c.Directs = 4
	}
	if c.ReadProb == 0 {
		c.ReadProb = 0.3
	}
	if c.ReadDelay == 0 {
		c.ReadDelay = time.Second
	}
	if c.TypingProb == 0 {
		c.TypingProb = 0.5
	}
	if c.EditProb == 0 {
		c.EditProb = 0.02
	}
	if c.ClearProb == 0 {
		c.ClearProb = 0.02
	}
	if c.ReceiptsProb == 0 {
		c.ReceiptsProb = 0.05
	}
	if c.Members == 0 {
		c.Members = 10000
	}
	if c.Online == 0 {
		c.Online = min(2000, c.Members)
	}
	if c.Senders == 0 {
		c.Senders = min(10, c.Online)
	}
	if c.Conns == 0 {
		c.Conns = 1000
	}
	if c.PingInterval == 0 {
		c.PingInterval = 30 * time.Second
	}

	if c.ConvsPer == 0 {
		c.ConvsPer = 3
	}
	if c.Msgs == 0 {
		c.Msgs = 5
	}
	if c.BodySize == 0 {
		c.BodySize = 100
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.Prefix == "" {
		c.Prefix = NewPrefix()
	}
}

// Validate applies the defaults and checks the bounds.
func (c *Config) Validate() error {
	c.setDefaults()
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if _, ok := scenarios[c.Scenario]; !ok {
		bad("unknown scenario %q (have %s)", c.Scenario, strings.Join(Scenarios(), ", "))
	}
	if c.Addr == "" || c.AdminURL == "" {
		bad("the gateway address and the admin URL are required")
	}
	if sendScenarios[c.Scenario] && !(c.Rate > 0 && c.Rate <= MaxRate) {
		bad("rate must be in (0, %d]", MaxRate)
	}
	if c.Rate < 0 || c.Rate > MaxRate {
		bad("rate must be in [0, %d]", MaxRate)
	}
	if c.Duration < 0 || c.Duration > MaxDuration {
		bad("duration must be at most %s", MaxDuration)
	}
	if c.Warmup < 0 || c.Warmup > time.Minute {
		bad("warmup must be at most 1m")
	}
	if c.Warmup > 0 && !sendScenarios[c.Scenario] {
		bad("warmup applies to direct, group, large and mixed")
	}
	if c.Drain < 0 || c.Drain > time.Minute {
		bad("drain must be at most 1m")
	}
	if c.Sources < 1 || c.Sources > MaxSources {
		bad("sources must be 1 to %d", MaxSources)
	}
	switch c.Transport {
	case "", "tcp":
		c.Transport = "tcp"
	case "ws":
		if c.Scenario == "storm" {
			bad("transport ws applies to every scenario but storm")
		}
	default:
		bad("transport must be tcp or ws")
	}
	if c.Client != ClientPipe && c.Client != ClientDo {
		bad("client must be %q or %q", ClientPipe, ClientDo)
	}
	if c.Pairs < 1 || c.Pairs > MaxPairs {
		bad("pairs must be 1 to %d", MaxPairs)
	}
	if c.Phones && c.Scenario != "direct" {
		bad("phones applies to scenario direct only")
	}
	if c.Scenario == "typing" {
		// Members are not connections here: each device is in many groups.
		if c.Groups < 1 || c.Size < 2 || c.Size > c.Devices || int64(c.Groups)*int64(c.Size) > MaxMembers {
			bad("typing: groups × size must be at most %d, with 2 to devices members a group", MaxMembers)
		}
	} else if c.Groups < 1 && !(c.Scenario == "mixed" && c.Groups < 0) || c.Size < 2 || int64(c.Groups)*int64(c.Size) > MaxConns {
		bad("groups × size must be at most %d, with at least 2 members a group", MaxConns)
	}
	if c.GroupOnline < 0 || c.GroupOnline > c.Size || c.GroupOnline == 1 {
		bad("group-online must be 2 to size (0: all)")
	}
	if c.Scenario == "mixed" {
		c.validateMixed(bad)
	}
	if c.Scenario == "notify" && (c.Size < 1 || c.Size > c.Users || c.Senders < 1 || c.Senders > c.Groups) {
		bad("notify: size 1 to users, senders 1 to groups")
	}
	if c.Members < 2 || c.Members > MaxMembers {
		bad("members must be 2 to %d", MaxMembers)
	}
	if c.Online < 2 || c.Online > c.Members || c.Online > MaxConns {
		bad("online must be 2 to min(members, %d)", MaxConns)
	}
	if c.Senders < 1 || c.Senders > c.Online {
		bad("senders must be 1 to online")
	}
	switch {
	case c.Moderate < 0 || c.Moderate > MaxModerate:
		bad("moderate must be 0 to %d requests per second", MaxModerate)
	case c.Moderate > 0 && c.Scenario != "large":
		bad("moderate applies to large")
	case c.Moderate > 0 && c.Members-c.Online < 2:
		bad("moderate needs at least 2 offline members (members − online): it mutes and removes those")
	}
	if c.Conns < 1 || c.Conns > MaxConns {
		bad("conns must be 1 to %d", MaxConns)
	}
	if c.PingInterval < 100*time.Millisecond {
		bad("ping interval must be at least 100ms")
	}
	if c.Devices < 2 || c.Devices > MaxConns {
		bad("devices must be 2 to %d", MaxConns)
	}
	if c.Scenario == "storm" && (c.Size > c.Devices || c.ConvsPer < 1 || c.ConvsPer > maxSnapshotConvs || c.Msgs < 0 || c.Msgs > 1000) {
		bad("storm: size at most devices, convs 1 to %d, msgs 0 to 1000", maxSnapshotConvs)
	}
	if (c.ProbePostgres != "" || c.ProbeRedis != "") && !(c.ProbeRate > 0 && c.ProbeRate <= 10000) {
		bad("probe rate must be in (0, 10000]")
	}
	if c.MetricsURL != "" {
		if u, err := url.Parse(c.MetricsURL); err != nil || u.Host == "" {
			bad("metrics URL %q: want http://host:port", c.MetricsURL)
		} else if !isLoopback(u.Hostname()) && !c.AllowRemote {
			bad("refusing a non-loopback metrics URL without -allow-remote")
		}
	}
	if c.BodySize < 8 || c.BodySize > MaxBodySize {
		bad("body size must be 8 to %d (the first 8 bytes carry the send time)", MaxBodySize)
	}
	if strings.ContainsAny(c.Prefix, "{}|") || len(c.Prefix) > 64 {
		bad("prefix must be at most 64 bytes without { } |")
	}
	if c.Addr != "" && c.AdminURL != "" {
		host, _, err := net.SplitHostPort(c.Addr)
		if err != nil {
			bad("addr: %v", err)
		}
		u, uerr := url.Parse(c.AdminURL)
		if uerr != nil || u.Host == "" {
			bad("admin URL %q: want http://host:port", c.AdminURL)
		}
		remote := err == nil && !isLoopback(host) || uerr == nil && u.Host != "" && !isLoopback(u.Hostname())
		if remote && !c.AllowRemote {
			bad("refusing a non-loopback server without -allow-remote (load tests hurt whatever they point at)")
		}
		if remote && c.Sources > 1 {
			bad("sources > 1 dials from 127.0.0.x: loopback servers only")
		}
	}
	return errors.Join(errs...)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// NewPrefix returns a fresh run prefix: "lt" + the time in base 36 + 4
// random bytes, so runs against one server never collide.
func NewPrefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("lt%s%x-", strconv.FormatInt(time.Now().Unix(), 36), b)
}

// scenarios maps a name to its driver.
var scenarios = map[string]func(context.Context, *runner) error{
	"direct": runDirect,
	"group":  runGroup,
	"large":  runLarge,
	"idle":   runIdle,
	"storm":  runStorm,
	"mixed":  runMixed,
	"notify": runNotify,
	"typing": runTyping,
}

// sendScenarios are the scenarios that pace sends (and need -rate).
var sendScenarios = map[string]bool{"direct": true, "group": true, "large": true, "mixed": true, "notify": true, "typing": true}

// Scenarios lists the scenario names.
func Scenarios() []string {
	names := make([]string, 0, len(scenarios))
	for n := range scenarios {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Run runs cfg's scenario and returns its report. An error means the run
// could not be made (bad config, provisioning or connecting failed); a
// run that was made but lost messages returns a report whose Failed is
// true.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := newRunner(cfg)
	defer r.close()
	var err error
	if r.probes, err = connectProbes(ctx, cfg); err != nil {
		return nil, err
	}
	if err := scenarios[cfg.Scenario](ctx, r); err != nil {
		return nil, err
	}
	return r.report, nil
}

// runner holds one run's state and the building blocks scenarios use.
type runner struct {
	// Static after construction.
	cfg     Config
	clk     clock
	admin   *Admin
	tracker *Tracker
	report  *Report // filled by finish

	sendOK  *Hist // send → send_ok, from the intended start
	push    *Hist // send → push at a receiver, from the intended start
	lag     *Hist // intended start → the moment the pacer issued the send
	connect *Hist // dial + auth
	errs    Errors

	sent       atomic.Int64 // sends issued (written or handed to Do)
	inflight   atomic.Int64 // sends without a reply yet
	lastOK     atomic.Int64 // unix nanos of the newest send_ok
	lastPush   atomic.Int64 // unix nanos of the newest counted push
	acks       atomic.Int64 // acks written
	acking     atomic.Bool  // devices ack (Config.AckDelay > 0) and the load is running
	warm       warmCounts   // counts at the end of the warm-up, left out of the report
	syncs      atomic.Int64 // sync pages read after hints
	pushesSeen atomic.Int64 // for Config.dropEvery
	syncQ      chan *Conn   // connections with hints to sync; set by connectAll
	hints      atomic.Int64
	kicks      atomic.Int64
	badReplies atomic.Int64 // replies with a rid the tool does not know
	// Auths answered RATE_LIMITED while connecting, retried (not errors).
	connectLimited atomic.Int64
	// The server's fan-out stream backlog, sampled each second (-metrics).
	backlogPeak atomic.Int64
	backlogSeen atomic.Bool
	fdLimit     int64
	notes       []string
	mix         *mixState   // scenario mixed: reads and multi-device figures; set before connecting
	features    *featureMix // scenario mixed: typing, edits, clears, receipts; nil when off
	probes      *probes     // Config.ProbePostgres, ProbeRedis (nil: none); set before the scenario runs
	moderator   *moderator  // scenario large with Config.Moderate; set before the load

	mu    sync.Mutex // guards conns
	conns []*Conn

	series   []series                             // the latency metrics of the timeline and the charts (default send_ok, push)
	line     func(TimelinePoint) string           // the live line (nil: the send scenarios' line)
	rss      func(context.Context) (int64, error) // idle: the server's RSS, sampled into the timeline
	tmu      sync.Mutex                           // guards timeline
	timeline []TimelinePoint

	wg     sync.WaitGroup     // every goroutine the runner starts
	stop   chan struct{}      // closed by close: writers and the live line end
	ctx    context.Context    // canceled by close: Do calls end
	cancel context.CancelFunc //
}

func newRunner(cfg Config) *runner {
	ctx, cancel := context.WithCancel(context.Background())
	return &runner{
		cfg: cfg, clk: newClock(), admin: NewAdmin(cfg.AdminURL, cfg.AdminToken), tracker: NewTracker(),
		sendOK: NewHist(), push: NewHist(), lag: NewHist(), connect: NewHist(),
		stop: make(chan struct{}), ctx: ctx, cancel: cancel,
		report: &Report{Scenario: cfg.Scenario},
	}
}

// goroutine starts f tracked by r.wg.
func (r *runner) goroutine(f func()) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f()
	}()
}

// note records a warning for the report.
func (r *runner) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// close closes every connection and waits for the runner's goroutines.
func (r *runner) close() {
	select {
	case <-r.stop:
		return
	default:
	}
	close(r.stop)
	r.cancel()
	r.probes.stopLoops()
	r.mu.Lock()
	conns := r.conns
	r.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	r.wg.Wait()
	r.probes.close()
}

// clock gives unix nanoseconds from the monotonic clock: immune to wall
// clock steps during a run, comparable with the times embedded in bodies
// (both ends live in this process).
type clock struct {
	base     time.Time
	baseUnix int64
}

func newClock() clock {
	now := time.Now()
	return clock{base: now, baseUnix: now.UnixNano()}
}

func (c clock) now() int64 { return c.baseUnix + int64(time.Since(c.base)) }
