// Command parley-cli is an interactive client for people trying Parley or
// debugging it, in the spirit of redis-cli. It is built on the reference
// client (client.Client), so what it shows is what an app would see.
// See docs/cli.md.
//
//	parley-cli [-addr HOST:PORT] -device D -token T                  interactive session
//	parley-cli [-addr HOST:PORT] -device D -token T [-json] COMMAND ARGS...   one command
//	parley-cli ... [-json] [-wait D] watch [CONV...]                 print new events
//	parley-cli admin [-admin URL] [-token ADMIN_TOKEN] [-json] user|device|group|conv ARGS...
//
// Exit status: 0 success, 1 the server refused (a protocol error code),
// 2 usage error, 3 the server could not be reached (or did not answer in
// time).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Exit statuses.
const (
	exitOK          = 0
	exitRefused     = 1 // a protocol error code from the server (or the admin API)
	exitUsage       = 2
	exitUnreachable = 3 // no answer: connection refused, dropped, timed out
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// options are the command line of a client session.
type options struct {
	addr, device, token string
	json                bool
	wait                time.Duration
	timeout             time.Duration
	autoAck             bool
	trace               bool
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// run is the whole program; tests call it in-process.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "admin" {
		return runAdmin(ctx, args[1:], stdout, stderr)
	}
	var o options
	fs := flag.NewFlagSet("parley-cli", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.addr, "addr", envOr("PARLEY_ADDR", "127.0.0.1:7070"), "gateway `host:port` ($PARLEY_ADDR)")
	fs.StringVar(&o.device, "device", os.Getenv("PARLEY_DEVICE"), "device `id` ($PARLEY_DEVICE)")
	fs.StringVar(&o.token, "token", os.Getenv("PARLEY_TOKEN"), "the device's `token` ($PARLEY_TOKEN)")
	fs.BoolVar(&o.json, "json", false, "print the reply of COMMAND as one JSON object (watch: one object per line)")
	fs.DurationVar(&o.wait, "wait", 0, "with watch: print events for `D`, then exit (0: until interrupted)")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "connect timeout, and timeout of each request")
	fs.BoolVar(&o.autoAck, "autoack", true, "interactive and watch: ack what arrives (the device's delivery cursor)")
	fs.BoolVar(&o.trace, "trace", false, "print every frame the server sends to stderr")
	fs.Usage = func() { usage(fs) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if o.device == "" || o.token == "" {
		fmt.Fprintln(stderr, "parley-cli: -device and -token are required (or $PARLEY_DEVICE, $PARLEY_TOKEN); try parley-cli -h")
		return exitUsage
	}
	if o.timeout <= 0 {
		fmt.Fprintln(stderr, "parley-cli: -timeout must be positive")
		return exitUsage
	}
	if fs.NArg() == 0 {
		if o.json || o.wait != 0 {
			fmt.Fprintln(stderr, "parley-cli: -json and -wait need a COMMAND")
			return exitUsage
		}
		return interactive(ctx, o, stdin, stdout, stderr)
	}
	return oneShot(ctx, o, fs.Args(), stdout, stderr)
}

func usage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprint(w, `parley-cli: a command-line client for Parley.

  parley-cli [flags]                        interactive session (type help)
  parley-cli [flags] [-json] COMMAND ARGS   run one command, print its reply
  parley-cli [flags] [-json] [-wait D] watch [CONV...]
                                            print new events as they arrive
  parley-cli admin -h                       create users, devices, groups

Flags:
`)
	fs.PrintDefaults()
	fmt.Fprint(w, "\nCommands:\n")
	printHelp(w)
	fmt.Fprint(w, `
Exit status: 0 ok, 1 the server refused (error code), 2 usage error,
3 the server could not be reached or did not answer in time.
`)
}
