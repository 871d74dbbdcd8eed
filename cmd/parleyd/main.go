// Command parleyd is the Parley server: a gnet gateway, the fan-out
// workers, the admin API and the metrics listener in one process.
//
//	parleyd [-config FILE] [-print-config]
//
// Every config key can be overridden by PARLEY_<KEY> (docs/config.md).
// SIGINT or SIGTERM shuts down gracefully; a second one forces exit.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/server"
)

func main() {
	path := flag.String("config", "", "config file (YAML)")
	printCfg := flag.Bool("print-config", false, "print every config key with its default and exit")
	flag.Parse()
	if *printCfg {
		for _, kv := range config.Keys() {
			fmt.Printf("%s: %q\n", kv[0], kv[1])
		}
		return
	}
	cfg, err := config.Load(*path, os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, "parleyd:", err)
		os.Exit(2)
	}
	// gnet's event loops and the store goroutines need at least two Ps for
	// good latency, even when parleyd is pinned to one core (taskset
	// leaves GOMAXPROCS at 1): with one, a goroutine made runnable while
	// the event loop waits in epoll_wait waits for the runtime to take the
	// P back. One P costs less CPU per send, at several times the p50
	// (BENCHMARKS.md, the rows "at 8de81cf" and "at 45fa4d4, GOMAXPROCS 2").
	if runtime.GOMAXPROCS(0) < 2 && os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(2)
	}
	tuneGC()
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	// go-redis logs through a package-level logger (stderr by default):
	// route it into the structured log.
	redis.SetLogger(redisLogger{log})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	srv, err := server.New(ctx, cfg, log)
	if err == nil {
		err = srv.Start(ctx)
	}
	cancel()
	if err != nil {
		log.Error("start", "err", err)
		os.Exit(1)
	}
	eff := srv.Config()
	log.Info("parleyd ready", readyAttrs(eff, srv.AdminAddr(), srv.MetricsAddr())...)
	if cfg.AdminToken == "" {
		log.Info("generated admin token (set admin_token or PARLEY_ADMIN_TOKEN to choose one)", "admin_token", eff.AdminToken)
	}

	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	log.Info("shutting down (send the signal again to force)")
	go func() {
		<-sig
		log.Warn("forced exit")
		os.Exit(1)
	}()
	sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("shutdown", "err", err)
	}
}

// readyAttrs are the attributes of the "parleyd ready" line: where each
// listener is, and the gateway's id. The WebSocket listener is named
// either way: as the URL a client connects to when ws_listen is set (a
// host left out or unspecified there is reached at 127.0.0.1), as "off"
// when it is not.
func readyAttrs(eff config.Config, admin, metrics string) []any {
	ws := "off"
	if host, port, err := net.SplitHostPort(eff.WSListen); eff.WSListen != "" && err == nil {
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			host = "127.0.0.1"
		}
		ws = "ws://" + net.JoinHostPort(host, port) + "/v1/ws"
	}
	return []any{"gateway", eff.Listen, "websocket", ws, "admin", "http://" + admin, "metrics", metrics, "gateway_id", eff.GatewayID}
}

// redisLogger adapts slog to go-redis's logger.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.WarnContext(ctx, "redis client", "msg", fmt.Sprintf(format, v...))
}

// gcPercent is parleyd's GOGC unless the environment sets one. parleyd's
// live heap is small and its garbage is short-lived frames and rows, so
// Go's default (collect when the heap has doubled) collects many times a
// second, and each collection takes a quarter of the Ps from the event
// loops while it marks. Collecting an eighth as often lowers both
// send_ok latency and CPU per send, for a heap that stays small beside
// the machine's memory (BENCHMARKS.md, the row "at 51c1682" on GOGC).
const gcPercent = 800

// tuneGC sets GOGC to gcPercent and, so that the larger heap cannot
// outgrow the machine, a soft memory limit of half the physical memory,
// each only if the environment does not set it.
func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	var si syscall.Sysinfo_t
	if os.Getenv("GOMEMLIMIT") == "" && syscall.Sysinfo(&si) == nil {
		debug.SetMemoryLimit(int64(si.Totalram) * int64(si.Unit) / 2)
	}
}
