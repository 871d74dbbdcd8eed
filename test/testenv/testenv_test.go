package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// These tests need the real services: `make services` or `make test`.

func TestPostgresURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	var inner string
	t.Run("fresh", func(t *testing.T) {
		inner = PostgresURL(t)
		conn, err := pgx.Connect(ctx, inner)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var db string
		if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(db, dbPrefix) || !strings.Contains(inner, "/"+db) {
			t.Fatalf("current_database() = %q, URL %q", db, inner)
		}
		// The database is empty and ours to change.
		var tables int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if tables != 0 {
			t.Fatalf("%d tables in a fresh database", tables)
		}
		if _, err := conn.Exec(ctx, "CREATE TABLE m (id bigint PRIMARY KEY); INSERT INTO m VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		// A connection left open does not stop the drop (WITH (FORCE)).
		if _, err := pgx.Connect(ctx, inner); err != nil {
			t.Fatal(err)
		}
	})

	// Two calls give two databases.
	a, b := PostgresURL(t), PostgresURL(t)
	if a == b {
		t.Fatalf("PostgresURL returned %q twice", a)
	}

	// The subtest's cleanup dropped its database.
	_, err := pgx.Connect(ctx, inner)
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("connecting to the dropped database: err = %v, want 'does not exist'", err)
	}
}

func TestWithDatabase(t *testing.T) {
	for _, c := range []struct{ base, want string }{
		{DefaultPostgresURL, "postgres://parley:parley@127.0.0.1:5432/x?sslmode=disable"},
		{"postgresql://u@h/db", "postgresql://u@h/x"},
		{"host=h user=u dbname=db", "host=h user=u dbname=db dbname=x"},
	} {
		got, err := withDatabase(c.base, "x")
		if err != nil || got != c.want {
			t.Errorf("withDatabase(%q) = %q, %v; want %q", c.base, got, err, c.want)
		}
	}
}

func TestRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	var url, prefix string
	t.Run("prefix", func(t *testing.T) {
		url, prefix = Redis(t)
		if !strings.HasPrefix(prefix, "t") || !strings.HasSuffix(prefix, ":") {
			t.Fatalf("prefix %q", prefix)
		}
		c := client(t, url)
		// More keys than one SCAN batch.
		pipe := c.Pipeline()
		for i := range 2500 {
			pipe.Set(ctx, fmt.Sprintf("%sk%d", prefix, i), i, 0)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	})

	_, other := Redis(t)
	if other == prefix {
		t.Fatalf("Redis returned prefix %q twice", prefix)
	}
	c := client(t, url)
	keep := other + "keep"
	if err := c.Set(ctx, keep, 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	// The subtest's cleanup deleted its keys, and only those.
	keys, _, err := c.Scan(ctx, 0, prefix+"*", 10000).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Exists(ctx, keep).Result(); len(keys) != 0 || n != 1 {
		t.Fatalf("after cleanup: %d keys %s*, %s exists=%d", len(keys), prefix, keep, n)
	}
}

func TestStartRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartRedis(t)
	if want := "redis://" + s.Addr() + "/0"; s.URL() != want {
		t.Fatalf("URL() = %q, want %q", s.URL(), want)
	}
	c := client(t, s.URL())

	mustSet := func() {
		t.Helper()
		if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	mustSet()
	s.Flush()
	if n := c.Exists(ctx, "k").Val(); n != 0 {
		t.Fatalf("key survived Flush")
	}

	mustSet()
	s.Kill()
	if err := ping(s.Addr()); err == nil {
		t.Fatal("PING answered after Kill")
	}
	s.Kill() // a second Kill does nothing

	s.Restart()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	if n := c.Exists(ctx, "k").Val(); n != 0 {
		t.Fatal("key survived Kill and Restart")
	}

	// Restart of a running server kills it first; SAVE's dump is not reloaded.
	mustSet()
	if err := c.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	if n := c.Exists(ctx, "k").Val(); n != 0 {
		t.Fatal("key survived SAVE and Restart")
	}
}

// FreePort hands out ports of 20000–31999 that were free, never the same
// one twice in a process, and binds them. A process outside the test run
// (which holds no port lock) can still take a port between FreePort and
// the caller's bind, which is why every server the helpers start retries
// with another port: so may this test, a bounded number of times.
func TestFreePort(t *testing.T) {
	t.Parallel()
	seen := map[int]bool{}
	var errs []error
	for range 3 {
		p := FreePort(t)
		if p < 20000 || p > 31999 || seen[p] {
			t.Fatalf("port %d: outside 20000-31999 or handed out before (%v)", p, seen)
		}
		seen[p] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err == nil {
			l.Close()
			return
		}
		errs = append(errs, err)
	}
	t.Fatalf("3 ports handed out, none could be bound: %v", errs)
}

func TestCheckFor(t *testing.T) {
	t.Parallel()
	n := 0
	CheckFor(t, 5*time.Second, time.Millisecond, func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if n != 3 {
		t.Fatalf("f called %d times, want 3", n)
	}

	// On timeout it fails the test with f's last error.
	ft := &fatalTB{TB: t}
	start := time.Now()
	ft.run(func() {
		CheckFor(ft, 50*time.Millisecond, 10*time.Millisecond, func() error { return errors.New("still broken") })
	})
	if d := time.Since(start); d < 50*time.Millisecond || d > 2*time.Second {
		t.Errorf("CheckFor gave up after %v, want about 50ms", d)
	}
	if !strings.Contains(ft.msg, "still broken") {
		t.Errorf("Fatal message %q does not carry f's error", ft.msg)
	}
}

// fatalTB records a Fatalf instead of failing the real test.
type fatalTB struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}

func (f *fatalTB) run(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	<-done
}

func client(t *testing.T, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}
