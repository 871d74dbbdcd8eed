// Package parleytest starts real parleyd servers for tests: in-process
// (Start) or as separate processes (StartProcess, for tests that kill a
// gateway), each on free loopback ports over a fresh PostgreSQL database
// and its own Redis key prefix, with helpers to provision users, devices
// and conversations through the admin API.
package parleytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/server"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/test/testenv"
)

// AdminToken is the admin token of every test server.
const AdminToken = "test-admin-token"

// Env is a running server and what a test needs to talk to it.
type Env struct {
	Cfg      config.Config
	Addr     string // gateway host:port
	WSAddr   string // the gateway's WebSocket host:port ("" unless the config set ws_listen)
	AdminURL string // http://host:port
	Srv      *server.Server
}

// Config returns a config for a test server over a fresh database and a
// private Redis prefix on the shared test Redis, on free ports. When
// PARLEY_TEST_REDIS_CLUSTER names a Redis Cluster (`make test-cluster`),
// the server uses that cluster (redis_cluster) instead; RedisURL is still
// set, for tests that need a standalone Redis of their own.
func Config(t testing.TB) config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.PostgresURL = testenv.PostgresURLFrom(t, schemaTemplate(t))
	cfg.RedisURL, cfg.RedisPrefix = testenv.Redis(t)
	cfg.RedisCluster = testenv.RedisClusterSeeds(t, cfg.RedisPrefix)
	cfg.AdminToken = AdminToken
	cfg.MetricsListen = ""
	cfg.PostgresMaxConns = 8
	return cfg
}

// schemaTemplate is a database with the schema applied, made once per
// test binary: each test's database is a copy of it, so the migrations
// run once instead of at every server's start (where they then find
// nothing to do).
func schemaTemplate(t testing.TB) string {
	t.Helper()
	return testenv.PostgresTemplate(t, "parley-schema", func(ctx context.Context, url string) error {
		st, err := store.Open(ctx, url, 1)
		if err != nil {
			return err
		}
		defer st.Close()
		return st.Migrate(ctx)
	})
}

// RedisClient returns a client of the Redis that a server with cfg uses
// (the cluster of cfg.RedisCluster if set, else cfg.RedisURL), closed at
// the test's cleanup.
func RedisClient(t testing.TB, cfg config.Config) redis.UniversalClient {
	t.Helper()
	var c redis.UniversalClient
	if cfg.RedisCluster != "" {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(cfg.RedisCluster, ",")})
	} else {
		opt, err := redis.ParseURL(cfg.RedisURL)
		if err != nil {
			t.Fatalf("redis_url: %v", err)
		}
		c = redis.NewClient(opt)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Start runs an in-process server with cfg (from Config, possibly
// changed), on fresh ports for the gateway and admin API (and for the
// WebSocket listener, if cfg.WSListen is set to anything).
func Start(t testing.TB, cfg config.Config) *Env {
	t.Helper()
	level := slog.LevelWarn
	if os.Getenv("PARLEY_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	return StartLogged(t, cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
}

// StartLogged is Start with the server's logger (for tests that read the
// server's log).
func StartLogged(t testing.TB, cfg config.Config, log *slog.Logger) *Env {
	t.Helper()
	gatewayID := cfg.GatewayID
	// The admin listener binds port 0 (no race); the gateway (gnet) needs
	// a port up front, and another process may take it between FreePort
	// and the bind: then try another.
	for attempt := 1; ; attempt++ {
		cfg.Listen = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		if cfg.WSListen != "" { // any value: a fresh port
			cfg.WSListen = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		}
		cfg.AdminListen = "127.0.0.1:0"
		if gatewayID == "" {
			cfg.GatewayID = "gw-" + strings.Split(cfg.Listen, ":")[1]
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		srv, err := server.New(ctx, cfg, log)
		if err == nil {
			if err = srv.Start(ctx); err != nil {
				_ = srv.Shutdown(ctx)
			}
		}
		cancel()
		if err != nil {
			if attempt < 5 && (strings.Contains(err.Error(), "address already in use") || strings.Contains(err.Error(), "bad file descriptor")) {
				continue
			}
			t.Fatalf("starting parleyd: %v", err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
		})
		return &Env{Cfg: srv.Config(), Addr: cfg.Listen, WSAddr: cfg.WSListen, AdminURL: "http://" + srv.AdminAddr(), Srv: srv}
	}
}

// Admin calls the admin API; out (if not nil) receives the JSON reply.
// It returns the HTTP status.
func (e *Env) Admin(t testing.TB, method, path string, body, out any) int {
	t.Helper()
	return AdminCall(t, e.AdminURL, method, path, body, out)
}

// AdminCall calls the admin API at base.
func AdminCall(t testing.TB, base, method, path string, body, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+AdminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: decoding %q: %v", method, path, b, err)
		}
	}
	return resp.StatusCode
}

// Device is a provisioned device.
type Device struct {
	ID, User, Token string
}

// User creates user id with the given devices ("<id>-d1", "<id>-d2", … when
// n is given) and returns the devices.
func (e *Env) User(t testing.TB, id string, devices int) []Device {
	t.Helper()
	return ProvisionUser(t, e.AdminURL, id, devices)
}

// Users creates n users named fmt.Sprintf(format, i), i from 0, with one
// device each, and returns their ids and devices.
func (e *Env) Users(t testing.TB, format string, n int) ([]string, []Device) {
	t.Helper()
	ids, devs := make([]string, n), make([]Device, n)
	for i := range ids {
		ids[i] = fmt.Sprintf(format, i)
		devs[i] = e.User(t, ids[i], 1)[0]
	}
	return ids, devs
}

// ProvisionUser is Env.User against any admin URL.
func ProvisionUser(t testing.TB, adminURL, id string, devices int) []Device {
	t.Helper()
	if st := AdminCall(t, adminURL, "POST", "/v1/users", map[string]string{"id": id}, nil); st != http.StatusCreated {
		t.Fatalf("creating user %s: status %d", id, st)
	}
	var out []Device
	for i := 1; i <= devices; i++ {
		var d struct{ ID, User, Token string }
		dev := fmt.Sprintf("%s-d%d", id, i)
		if st := AdminCall(t, adminURL, "POST", "/v1/devices", map[string]string{"id": dev, "user": id}, &d); st != http.StatusCreated {
			t.Fatalf("creating device %s: status %d", dev, st)
		}
		out = append(out, Device{ID: d.ID, User: d.User, Token: d.Token})
	}
	return out
}

// Group creates a group conversation through the admin API and returns
// its head.
func (e *Env) Group(t testing.TB, id string, members ...string) int64 {
	t.Helper()
	var out struct{ Head int64 }
	if st := e.Admin(t, "POST", "/v1/conversations", map[string]any{"id": id, "kind": "group", "members": members}, &out); st != http.StatusCreated {
		t.Fatalf("creating group %s: status %d", id, st)
	}
	return out.Head
}
