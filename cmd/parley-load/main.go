// Command parley-load drives open-loop load against a running Parley and
// reports throughput, latency percentiles (HDR histograms, measured from
// each send's intended start), exact delivery checks and server CPU per
// send. See docs/loadtest.md.
//
//	parley-load SCENARIO -addr HOST:PORT -admin URL -token T -rate N -duration D [-json FILE] [scenario flags]
//
// Scenarios: direct. Exit status: 0 when every confirmed message was
// pushed exactly once, 1 when one was lost or duplicated, 2 for a usage
// error, 3 when the run could not be made.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
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
	fs.StringVar(&cfg.Addr, "addr", "127.0.0.1:7070", "gateway `host:port`")
	fs.StringVar(&cfg.AdminURL, "admin", "http://127.0.0.1:8081", "admin API `URL`")
	fs.StringVar(&cfg.AdminToken, "token", "", "admin `token` (default: $PARLEY_ADMIN_TOKEN)")
	fs.Float64Var(&cfg.Rate, "rate", 0, "target sends per second, `N`, aggregate over all senders (required)")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "send window (at most 10m)")
	fs.DurationVar(&cfg.Drain, "drain", 3*time.Second, "after the window, wait this long at most for replies and pushes")
	jsonFile := fs.String("json", "", "write the report as JSON to `FILE`")
	fs.IntVar(&cfg.Sources, "sources", 1, "dial from 127.0.0.1 … 127.0.0.`N` (each source address has ~28k ports)")
	fs.BoolVar(&cfg.AllowRemote, "allow-remote", false, "allow a server that is not on loopback")
	fs.IntVar(&cfg.ServerPID, "server-pid", 0, "report this process's CPU per send (/proc/`PID`/stat)")
	cpu := fs.String("cpu", "", "also report CPU of these process trees: `name=PID,…` (e.g. postgres=$(pgrep -o postgres))")
	client := fs.String("client", string(loadtest.ClientPipe), "how sends travel: pipe (coalesced writes, rid matching) or do (client.Conn.Do per send)")
	fs.DurationVar(&cfg.AckDelay, "ack", 50*time.Millisecond, "each device acks what it holds at most this often, like client.Client's AutoAck (0: never ack)")
	fs.Int64Var(&cfg.MaxInflight, "max-inflight", loadtest.DefaultMaxInflight, "at most this many sends awaiting a reply; more count as CLIENT_BACKLOG")
	fs.StringVar(&cfg.Prefix, "prefix", "", "id prefix of this run's users, devices and conversations (default: fresh)")
	live := fs.String("live", "auto", "progress line: auto, tty, lines or off")
	// Scenario direct.
	fs.IntVar(&cfg.Pairs, "pairs", 100, "direct: pairs of users (one device each, both send)")
	fs.IntVar(&cfg.BodySize, "body-size", 100, "message body `bytes` (the first 8 carry the send time)")
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
	if *jsonFile != "" {
		f, err := os.Create(*jsonFile)
		if err == nil {
			err = rep.WriteJSON(f)
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
		fmt.Fprintf(os.Stderr, "parley-load: FAILED: %d confirmed deliveries lost, %d duplicated\n", rep.Lost, rep.Duplicated)
		return 1
	}
	return 0
}

func usage(fs *flag.FlagSet) {
	fmt.Fprintf(os.Stderr, "usage: parley-load SCENARIO -addr HOST:PORT -admin URL -token T -rate N -duration D [-json FILE] [flags]\n"+
		"scenarios: %s\n", strings.Join(loadtest.Scenarios(), ", "))
	if fs.Name() != "parley-load" {
		fs.PrintDefaults()
	}
}
