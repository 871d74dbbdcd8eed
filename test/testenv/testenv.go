// Package testenv gives tests real PostgreSQL and Redis: a fresh database per
// test, a private Redis key prefix, a private redis-server process for tests
// that kill or flush it, or a private 6-node Redis Cluster for tests that fail
// its masters over (StartRedisCluster), and tools from Debian packages
// installed on demand (Command; HAProxy runs haproxy with a test's
// configuration).
//
// The shared servers are the ones `make services` (tools/ensure-services.sh)
// sets up; `make test` starts them and points the tests at them with
// PARLEY_TEST_POSTGRES_URL and PARLEY_TEST_REDIS_URL. When a server is not
// reachable the test fails with a message saying so: these are not mocks, and
// tests do not silently skip.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
)

const (
	// DefaultPostgresURL is used when PARLEY_TEST_POSTGRES_URL is unset.
	DefaultPostgresURL = "postgres://parley:parley@127.0.0.1:5432/parley?sslmode=disable"
	// DefaultRedisURL is used when PARLEY_TEST_REDIS_URL is unset.
	DefaultRedisURL = "redis://127.0.0.1:6379/0"

	// EnvPostgresURL names the variable holding the test PostgreSQL URL. Its
	// role needs CREATEDB: every PostgresURL call creates a database.
	EnvPostgresURL = "PARLEY_TEST_POSTGRES_URL"
	// EnvRedisURL names the variable holding the shared test Redis URL.
	EnvRedisURL = "PARLEY_TEST_REDIS_URL"

	// dbPrefix starts the name of every database PostgresURL creates.
	dbPrefix = "parley_t_"
	// staleAfter is the age past which a leftover test database (from a test
	// binary that died before its cleanups ran) is dropped.
	staleAfter = 2 * time.Hour

	setupTimeout = 15 * time.Second
	howToStart   = "start the test services with `make services` (or run the tests with `make test`)"
)

// PostgresURL creates a fresh database (named parley_t_<random>) on the server
// of PARLEY_TEST_POSTGRES_URL (default DefaultPostgresURL), registers a
// t.Cleanup that drops it (WITH (FORCE), so connections still open are cut),
// and returns the URL of the new database. It fails the test with t.Fatal if
// the server is unreachable.
//
// The database is empty: each test applies its own schema.
func PostgresURL(t testing.TB) string {
	t.Helper()
	return newDatabase(t, "")
}

// PostgresURLFrom is PostgresURL with the new database a copy of the
// database template (CREATE DATABASE … TEMPLATE, a copy of its files),
// such as one that PostgresTemplate made: a schema applied once per test
// binary instead of once per test. Nothing may stay connected to
// template.
func PostgresURLFrom(t testing.TB, template string) string {
	t.Helper()
	return newDatabase(t, template)
}

// templates: the databases PostgresTemplate made in this process, by key.
var (
	templatesMu sync.Mutex
	templates   = map[string]*template{}
)

type template struct {
	once sync.Once
	name string
	err  error
}

// PostgresTemplate returns the name of a database made once per process
// for key: created like PostgresURL's and prepared by prepare (given its
// URL), which must close every connection it opened. It is not dropped
// at a test's end, since later tests copy it; sweepStale of a later run
// drops it, as it does a killed test binary's databases.
func PostgresTemplate(t testing.TB, key string, prepare func(ctx context.Context, url string) error) string {
	t.Helper()
	templatesMu.Lock()
	tpl := templates[key]
	if tpl == nil {
		tpl = &template{}
		templates[key] = tpl
	}
	templatesMu.Unlock()
	tpl.once.Do(func() {
		base := envOr(EnvPostgresURL, DefaultPostgresURL)
		ctx, cancel := context.WithTimeout(context.Background(), 2*setupTimeout)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			tpl.err = fmt.Errorf("cannot connect to the test PostgreSQL at %s (%s): %w", redactURL(base), EnvPostgresURL, err)
			return
		}
		defer conn.Close(context.Background())
		name := fmt.Sprintf("%s%x_%s", dbPrefix, time.Now().Unix(), randomHex(6))
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			tpl.err = fmt.Errorf("CREATE DATABASE %s: %w", name, err)
			return
		}
		u, err := withDatabase(base, name)
		if err == nil {
			err = prepare(ctx, u)
		}
		if err != nil {
			tpl.err = fmt.Errorf("preparing template database %s (%s): %w", name, key, err)
			return
		}
		tpl.name = name
	})
	if tpl.err != nil {
		t.Fatalf("testenv: %v", tpl.err)
	}
	return tpl.name
}

// newDatabase is PostgresURL, the new database a copy of template if
// that is not "".
func newDatabase(t testing.TB, template string) string {
	t.Helper()
	base := envOr(EnvPostgresURL, DefaultPostgresURL)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()

	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("testenv: cannot connect to the test PostgreSQL at %s (%s): %v\n"+
			"testenv: %s, or point %s at a server where the role may CREATE DATABASE",
			redactURL(base), EnvPostgresURL, err, howToStart, EnvPostgresURL)
	}
	defer conn.Close(context.Background())

	sweepOnce.Do(func() { sweepStale(ctx, t, conn) })

	// The creation time in the name lets a later run drop leftovers.
	name := fmt.Sprintf("%s%x_%s", dbPrefix, time.Now().Unix(), randomHex(6))
	create := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		create += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if _, err := conn.Exec(ctx, create); err != nil {
		t.Fatalf("testenv: %s on %s: %v (the role needs CREATEDB)", create, redactURL(base), err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("testenv: dropping test database %s: %v", name, err)
			return
		}
		defer conn.Close(context.Background())
		// FORCE cannot end a backend of another role: an autovacuum worker
		// that just started on the database (SQLSTATE 42501). It finishes
		// soon; try again for a while, then leave the database to
		// sweepStale of a later run rather than fail the test.
		for attempt := 0; ; attempt++ {
			_, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			var pgErr *pgconn.PgError
			switch {
			case err == nil:
				return
			case errors.As(err, &pgErr) && pgErr.Code == "42501" && attempt < 50:
				time.Sleep(100 * time.Millisecond)
			case errors.As(err, &pgErr) && pgErr.Code == "42501":
				t.Logf("testenv: test database %s left for a later sweep: %v", name, err)
				return
			default:
				t.Errorf("testenv: dropping test database %s: %v", name, err)
				return
			}
		}
	})

	u, err := withDatabase(base, name)
	if err != nil {
		t.Fatalf("testenv: %s: %v", EnvPostgresURL, err)
	}
	return u
}

var sweepOnce sync.Once

// sweepStale drops test databases older than staleAfter, left behind by test
// binaries that were killed (a -timeout panic skips cleanups). Best effort.
func sweepStale(ctx context.Context, t testing.TB, conn *pgx.Conn) {
	rows, err := conn.Query(ctx, "SELECT datname FROM pg_database WHERE starts_with(datname, $1)", dbPrefix)
	if err != nil {
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, name := range names {
		stamp, _, ok := strings.Cut(strings.TrimPrefix(name, dbPrefix), "_")
		if !ok {
			continue
		}
		secs, err := strconv.ParseInt(stamp, 16, 64)
		if err != nil || time.Since(time.Unix(secs, 0)) < staleAfter {
			continue
		}
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err == nil {
			t.Logf("testenv: dropped stale test database %s", name)
		}
	}
}

// withDatabase returns the connection string base with its database replaced
// by name. base may be a URL or a keyword/value string.
func withDatabase(base, name string) (string, error) {
	if strings.HasPrefix(base, "postgres://") || strings.HasPrefix(base, "postgresql://") {
		u, err := url.Parse(base)
		if err != nil {
			return "", err
		}
		u.Path = "/" + name
		u.RawPath = ""
		return u.String(), nil
	}
	// Keyword/value form: a later keyword overrides an earlier one.
	return base + " dbname=" + name, nil
}

// Redis returns the URL of the shared test Redis (PARLEY_TEST_REDIS_URL,
// default DefaultRedisURL) and a key prefix unique to this test, like
// "t3f9a0c1d2e4b:". The test must put every key it writes under the prefix;
// a t.Cleanup deletes every key with the prefix (SCAN + UNLINK). It fails the
// test with t.Fatal if the server is unreachable.
//
// Tests that need FLUSHALL, CONFIG SET, a restart or a dead server use
// StartRedis instead.
func Redis(t testing.TB) (url, prefix string) {
	t.Helper()
	url = envOr(EnvRedisURL, DefaultRedisURL)
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("testenv: %s=%q: %v", EnvRedisURL, redactURL(url), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	// Dial first: go-redis would retry and log each refused dial.
	if conn, derr := net.DialTimeout(opt.Network, opt.Addr, 2*time.Second); derr != nil {
		err = derr
	} else {
		conn.Close()
		probe := *opt
		probe.MaxRetries = -1
		c := redis.NewClient(&probe)
		err = c.Ping(ctx).Err()
		c.Close()
	}
	if err != nil {
		t.Fatalf("testenv: cannot reach the test Redis at %s (%s): %v\ntestenv: %s, or set %s",
			redactURL(url), EnvRedisURL, err, howToStart, EnvRedisURL)
	}

	prefix = "t" + randomHex(6) + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		c := redis.NewClient(opt)
		defer c.Close()
		if err := deletePrefix(ctx, c, prefix); err != nil {
			t.Errorf("testenv: deleting Redis keys %s*: %v", prefix, err)
		}
	})
	return url, prefix
}

// RedisClient is Redis with a client of that Redis, closed at the test's
// cleanup, and the test's key prefix.
func RedisClient(t testing.TB) (*redis.Client, string) {
	t.Helper()
	url, prefix := Redis(t)
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c, prefix
}

// deletePrefix unlinks every key starting with prefix, on a single
// server or on one cluster node. prefix holds no glob metacharacters. One
// UNLINK per key, pipelined: a cluster node refuses a multi-key UNLINK
// across slots.
func deletePrefix(ctx context.Context, c *redis.Client, prefix string) error {
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, prefix+"*", 1000).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range keys {
					p.Unlink(ctx, k)
				}
				return nil
			}); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// handedOut is every port FreePort returned in this process.
var handedOut = struct {
	mu    sync.Mutex
	ports map[int]bool
	locks []*os.File // held until the process exits
}{ports: map[int]bool{}}

// portLockDir holds a lock file per port handed out: test binaries run
// side by side (go test runs packages in parallel), and each holds an
// exclusive flock on the ports it handed out until it exits, so that
// another binary does not hand out the same port before its test bound
// it. The kernel drops the locks of a process that dies.
var portLockDir = sync.OnceValue(func() string {
	dir := filepath.Join(os.TempDir(), "parley-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return "" // no locks here: the listen check alone
	}
	return dir
})

// reservePort takes port's lock for this process; false if another
// process holds it.
func reservePort(port int) bool {
	dir := portLockDir()
	if dir == "" {
		return true
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return false
	}
	handedOut.locks = append(handedOut.locks, f)
	return true
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago,
// from 20000–31999: below the kernel's ephemeral range, and low enough for
// a Redis cluster node, whose bus listens on port+10000.
func FreePort(t testing.TB) int {
	t.Helper()
	// Not port 0: the kernel hands out ephemeral ports (32768–60999 here),
	// and once this listener closes the same port can be taken by any
	// outgoing connection (to PostgreSQL, Redis, another test's server)
	// before the caller binds it. Ports below the ephemeral range are only
	// ever taken by listeners like this one.
	//
	// A port is handed out once per process, and by one process at a
	// time (reservePort): a test that got it may not have bound it yet (a
	// server still starting), and another test must not get it
	// meanwhile.
	handedOut.mu.Lock()
	defer handedOut.mu.Unlock()
	for i := 0; i < 200; i++ {
		port := 20000 + mrand.IntN(12000)
		if handedOut.ports[port] || !reservePort(port) {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		handedOut.ports[port] = true
		return port
	}
	t.Fatalf("testenv: no free port found in 20000-31999")
	return 0
}

// CheckFor calls f every interval until it returns nil, or until timeout has
// passed, and then fails the test with t.Fatal and f's last error. f is always
// called at least once. Call it from the test's goroutine.
func CheckFor(t testing.TB, timeout, interval time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if !time.Now().Before(deadline) {
			t.Fatalf("testenv: condition still false after %v: %v", timeout, err)
			return
		}
		time.Sleep(min(interval, time.Until(deadline)+time.Millisecond))
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// redactURL hides the password of a URL for messages.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	if _, ok := u.User.Password(); !ok {
		return s
	}
	return u.Redacted()
}
