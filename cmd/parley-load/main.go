// Command parley-load drives open-loop load against a running Parley and
// reports throughput, latency percentiles (HDR histograms, measured from
// each send's intended start), exact delivery checks and server CPU per
// send. See docs/loadtest.md.
//
//	parley-load SCENARIO -addr HOST:PORT -admin URL -token T -rate N -duration D [-json FILE] [scenario flags]
//
// Scenarios: direct, group, large, idle, storm, mixed, typing, notify.
// Exit status: 0 when every confirmed message was pushed exactly once
// (idle: every connection held; storm: every device reconnected and got
// its snapshot; mixed: also no read_ok below the seq read; notify: also no
// owed notification missing, none unexpected, none badly signed), 1 when
// not, 2 for a usage error, 3 when the run could not be made.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/parley-im/parley/loadtest"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		usage(flag.NewFlagSet("parley-load", flag.ContinueOnError))
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			return 0
		}
		return 2
	}
	cfg := loadtest.Config{Scenario: args[0]}
	fs := flag.NewFlagSet("parley-load "+args[0], flag.ContinueOnError)
	fs.Usage = func() { usage(fs) }
	fs.StringVar(&cfg.Addr, "addr", "127.0.0.1:7070", "gateway `host:port` (with -transport ws: its ws_listen)")
	fs.StringVar(&cfg.Transport, "transport", "tcp", "tcp, or ws: WebSocket to ws://ADDR/v1/ws (every scenario but storm)")
	fs.StringVar(&cfg.AdminURL, "admin", "http://127.0.0.1:8081", "admin API `URL`")
	fs.StringVar(&cfg.AdminToken, "token", "", "admin `token` (default: $PARLEY_ADMIN_TOKEN)")
	fs.Float64Var(&cfg.Rate, "rate", 0, "target sends per second, `N`, aggregate over all senders (required by direct, group, large, mixed)")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "send window; idle: how long to hold the connections (at most 10m)")
	fs.DurationVar(&cfg.Warmup, "warmup", 0, "direct, group, large, mixed: send at -rate this long first and leave it out of latencies, rates and CPU (lost and duplicated still count it)")
	fs.DurationVar(&cfg.Drain, "drain", 3*time.Second, "after the window, wait for replies and pushes until none arrived for this long (60 s after the window at most)")
	jsonFile := fs.String("json", "", "write the report as JSON to `FILE`")
	cpuProfile := fs.String("cpuprofile", "", "write the tool's own CPU profile (go tool pprof) to `FILE`")
	htmlFile := fs.String("html", "", "write the report as a self-contained HTML page with charts to `FILE`")
	fs.IntVar(&cfg.Sources, "sources", 1, "dial from 127.0.0.1 … 127.0.0.`N` (each source address has ~28k ports)")
	fs.BoolVar(&cfg.AllowRemote, "allow-remote", false, "allow a server that is not on loopback")
	fs.IntVar(&cfg.ServerPID, "server-pid", 0, "report this process's CPU per send (/proc/`PID`/stat)")
	cpu := fs.String("cpu", "", "also report CPU of these process trees: `name=PID,…` (e.g. postgres=$(pgrep -o postgres))")
	client := fs.String("client", string(loadtest.ClientPipe), "how sends travel: pipe (coalesced writes, rid matching) or do (client.Conn.Do per send)")
	fs.DurationVar(&cfg.AckDelay, "ack", 50*time.Millisecond, "each device acks what it holds at most this often, like client.Client's AutoAck (0: never ack)")
	fs.Int64Var(&cfg.MaxInflight, "max-inflight", loadtest.DefaultMaxInflight, "at most this many sends awaiting a reply; more count as CLIENT_BACKLOG")
	fs.StringVar(&cfg.Prefix, "prefix", "", "id prefix of this run's users, devices and conversations (default: fresh)")
	live := fs.String("live", "auto", "progress line: auto, tty, lines or off")
	fs.StringVar(&cfg.ProbePostgres, "probe-postgres", "", "run a bare commit probe against this PostgreSQL `URL` (one-row insert per transaction into its own table) and report the WAL written per send (pg_stat_wal)")
	fs.StringVar(&cfg.ProbeRedis, "probe-redis", "", "run a PING probe against this Redis `URL`")
	fs.Float64Var(&cfg.ProbeRate, "probe-rate", 200, "probes per second, each")
	// Scenario direct.
	fs.IntVar(&cfg.Pairs, "pairs", 100, "direct: pairs of users (one device each, both send)")
	fs.BoolVar(&cfg.Phones, "phones", false, "direct: every user also has a phone, a second device registered for notifications with the tool's webhook sink (-sink) and never connected; the connected devices register too (the server's notify_webhook_url must point at -sink)")
	fs.IntVar(&cfg.BodySize, "body-size", 100, "message body `bytes` (the first 8 carry the send time)")
	// Scenario group (and storm's -size, mixed's -groups and -size).
	fs.IntVar(&cfg.Groups, "groups", 0, "group: how many groups (default 50); mixed: groups with members drawn at random (default users/size; 0: none); notify: groups (default 2000)")
	fs.IntVar(&cfg.Size, "size", 0, "group, mixed: members per group (default 20); storm: members per conversation (default 5)")
	fs.IntVar(&cfg.GroupOnline, "group-online", 0, "group: members of each group that connect (the rest are offline members; default all)")
	// Scenario large.
	fs.IntVar(&cfg.Members, "members", 10000, "large: members of the group")
	fs.IntVar(&cfg.Online, "online", 0, "large: members connected (default min(2000, members))")
	fs.IntVar(&cfg.Senders, "senders", 0, "large: online members that send (default min(10, online)); notify: sender devices (default 20)")
	fs.Float64Var(&cfg.Moderate, "moderate", 0, "large: a moderator (an online member that does not send, made the group's owner) mutes and removes offline members, alternately, `RATE` times a second during the window (0: none)")
	// Scenario idle.
	fs.IntVar(&cfg.Conns, "conns", 1000, "idle: connections to hold")
	fs.DurationVar(&cfg.PingInterval, "ping", 30*time.Second, "idle: each connection pings this often")
	fs.StringVar(&cfg.MetricsURL, "metrics", "", "idle: the server's metrics listener `URL` (http://host:port), for its RSS when -server-pid is not given")
	// Scenario storm.
	fs.IntVar(&cfg.Devices, "devices", 2000, "storm: devices that drop and reconnect at once")
	fs.IntVar(&cfg.ConvsPer, "convs", 3, "storm: conversations per device")
	fs.IntVar(&cfg.Msgs, "msgs", 5, "storm: messages per conversation, sent before the storm")
	fs.StringVar(&cfg.JWTSecret, "jwt-secret", "", "storm: authenticate with HS256 JWTs signed with this `secret` (the server's jwt_hmac_secret); every login is a device's first, provisioned by the server")
	fs.StringVar(&cfg.JWTKeyFile, "jwt-key", "", "storm: as -jwt-secret, signing with this PEM private key `file` (RSA: RS256, ECDSA P-256: ES256, Ed25519: EdDSA)")
	// Scenario mixed.
	fs.IntVar(&cfg.Users, "users", 1000, "mixed: users; notify: receivers")
	fs.StringVar(&cfg.NotifySink, "sink", "127.0.0.1:9099", "notify, direct -phones: the webhook sink's listen `address` (the server's notify_webhook_url must point there)")
	fs.StringVar(&cfg.NotifySecret, "sink-secret", "", "notify, direct -phones: the server's notify_webhook_secret, to check signatures (empty: not checked)")
	fs.DurationVar(&cfg.NotifyDelay, "notify-delay", 3*time.Second, "notify, direct -phones: the server's notify_delay")
	fs.Float64Var(&cfg.DevicesPerUser, "devices-per-user", 1.6, "mixed: devices per user on average, 1 to 8 (each user gets ⌊`D`⌋ or ⌈D⌉, all connected)")
	fs.IntVar(&cfg.Directs, "directs", 4, "mixed: direct conversations per user (0: none)")
	fs.Float64Var(&cfg.ReadProb, "read-prob", 0.3, "mixed: a device pushed a message reads its conversation with this probability `P` (0: never)")
	fs.DurationVar(&cfg.ReadDelay, "read-delay", time.Second, "mixed: a read is sent this long (±50%) after the push that caused it; pushes meanwhile raise its seq (0: at once)")
	fs.BoolVar(&cfg.NoFeatures, "no-features", false, "mixed: no typing, edits, clears or receipts (to compare a run without them)")
	fs.Float64Var(&cfg.TypingProb, "typing-prob", 0.5, "mixed: a typing frame precedes a send with probability `P` (0: never)")
	fs.Float64Var(&cfg.EditProb, "edit-prob", 0.02, "mixed: a confirmed send is edited with probability `P` (0: never)")
	fs.Float64Var(&cfg.ClearProb, "clear-prob", 0.02, "mixed: a read of a single-device user is followed by a clear (delete for me) up to it with probability `P` (0: never)")
	fs.Float64Var(&cfg.ReceiptsProb, "receipts-prob", 0.05, "mixed: a read of a direct conversation is followed by a receipts query with probability `P` (0: never)")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "parley-load: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if cfg.AckDelay == 0 {
		cfg.AckDelay = -1 // never
	}
	// An explicit 0 means none (the Config's zero value means the default).
	fs.Visit(func(f *flag.Flag) {
		switch {
		case f.Name == "groups" && cfg.Groups == 0 && cfg.Scenario == "mixed":
			cfg.Groups = -1
		case f.Name == "directs" && cfg.Directs == 0:
			cfg.Directs = -1
		case f.Name == "read-prob" && cfg.ReadProb == 0:
			cfg.ReadProb = -1
		case f.Name == "read-delay" && cfg.ReadDelay == 0:
			cfg.ReadDelay = -1
		case f.Name == "typing-prob" && cfg.TypingProb == 0:
			cfg.TypingProb = -1
		case f.Name == "edit-prob" && cfg.EditProb == 0:
			cfg.EditProb = -1
		case f.Name == "clear-prob" && cfg.ClearProb == 0:
			cfg.ClearProb = -1
		case f.Name == "receipts-prob" && cfg.ReceiptsProb == 0:
			cfg.ReceiptsProb = -1
		}
	})
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "parley-load: -cpuprofile: %v\n", err)
			return 2
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	if cfg.AdminToken == "" {
		cfg.AdminToken = os.Getenv("PARLEY_ADMIN_TOKEN")
	}
	cfg.Client = loadtest.ClientMode(*client)
	if *cpu != "" {
		cfg.CPUPIDs = map[string]int{}
		for _, kv := range strings.Split(*cpu, ",") {
			name, p, ok := strings.Cut(kv, "=")
			pid, err := strconv.Atoi(p)
			if !ok || err != nil || name == "" || name == "server" || name == "load-tool" {
				fmt.Fprintf(os.Stderr, "parley-load: -cpu: want name=PID, got %q\n", kv)
				return 2
			}
			cfg.CPUPIDs[name] = pid
		}
	}
	cfg.Out = os.Stdout
	switch *live {
	case "auto":
		cfg.Live = loadtest.LiveLines
		if fi, err := os.Stdout.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			cfg.Live = loadtest.LiveTTY
		}
	case "tty":
		cfg.Live = loadtest.LiveTTY
	case "lines":
		cfg.Live = loadtest.LiveLines
	case "off":
		cfg.Live = loadtest.LiveOff
	default:
		fmt.Fprintf(os.Stderr, "parley-load: -live: want auto, tty, lines or off\n")
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "parley-load:", err)
		return 2
	}

	// The first SIGINT ends the send window early (the report is still
	// written); a second one exits at once.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "\nparley-load: stopping (again to abort)")
		cancel()
		<-sig
		os.Exit(3)
	}()

	rep, err := loadtest.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "parley-load:", err)
		return 3
	}
	rep.WriteTable(os.Stdout)
	for _, out := range []struct {
		file  string
		write func(io.Writer) error
	}{{*jsonFile, rep.WriteJSON}, {*htmlFile, rep.WriteHTML}} {
		if out.file == "" {
			continue
		}
		f, err := os.Create(out.file)
		if err == nil {
			err = out.write(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "parley-load: writing the report:", err)
			return 3
		}
	}
	if rep.Failed() {
		switch {
		case rep.Idle != nil:
			fmt.Fprintf(os.Stderr, "parley-load: FAILED: %d connections not made, %d dropped\n", rep.Idle.Failed, rep.Idle.Dropped)
		case rep.Storm != nil:
			fmt.Fprintf(os.Stderr, "parley-load: FAILED: %d devices did not reconnect and resync, %d snapshot items wrong\n", rep.Storm.Failed, rep.Storm.SnapshotMismatch)
		case rep.Mixed != nil:
			fmt.Fprintf(os.Stderr, "parley-load: FAILED: %d confirmed deliveries lost, %d duplicated, %d read_ok below the seq read\n", rep.Lost, rep.Duplicated, rep.Mixed.ReadShort)
		default:
			fmt.Fprintf(os.Stderr, "parley-load: FAILED: %d confirmed deliveries lost, %d duplicated\n", rep.Lost, rep.Duplicated)
		}
		return 1
	}
	return 0
}

// scenarioHelp is the one-line description of each scenario in the usage
// text.
var scenarioHelp = map[string]string{
	"direct": "pairs of users, one device each, sending to each other (-pairs)",
	"group":  "groups of one-device members (-groups, -size)",
	"large":  "one large group, some members online, a few sending (-members, -online, -senders, -moderate)",
	"idle":   "connections held open, pinging; server RSS per connection (-conns, -ping)",
	"storm":  "every device drops and reconnects at once, then snapshots (-devices, -convs, -size, -msgs; -jwt-secret or -jwt-key: JWT first logins)",
	"typing": "typing frames only, relayed to the groups' other members (-devices, -groups, -size)",
	"mixed": "multi-device users (-devices-per-user) in direct conversations and groups, random\n" +
		"          senders, read reports (-users, -directs, -groups, -size, -read-prob, -read-delay)",
	"notify": "groups of offline receivers owed webhook notifications, which the tool's sink receives\n" +
		"          and checks (-groups, -size, -users, -senders, -sink, -sink-secret, -notify-delay)",
}

func usage(fs *flag.FlagSet) {
	fmt.Fprintf(os.Stderr, "usage: parley-load SCENARIO -addr HOST:PORT -admin URL -token T -rate N -duration D [-json FILE] [flags]\nscenarios:\n")
	for _, name := range loadtest.Scenarios() {
		fmt.Fprintf(os.Stderr, "  %-7s %s\n", name, scenarioHelp[name])
	}
	if fs.Name() != "parley-load" {
		fs.PrintDefaults()
	}
}
