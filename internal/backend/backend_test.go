package backend_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/internal/backend"
	"github.com/parley-im/parley/test/testenv"
)

// TestIsUnavailable: typed failures of a backend that is down or slow are
// unavailability; everything else, whatever its text says, is not.
func TestIsUnavailable(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain error", errors.New("boom"), false},
		{"text that looks like an outage", errors.New("connection refused: conn closed, unexpected EOF"), false},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"syntax error", fmt.Errorf("store: %w", &pgconn.PgError{Code: "42601"}), false},
		{"marked", fmt.Errorf("batch: closed: %w", backend.ErrUnavailable), true},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), true},
		{"canceled", context.Canceled, true},
		{"network", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("refused")}, true},
		{"cut short", fmt.Errorf("reading: %w", io.ErrUnexpectedEOF), true},
		{"connection exception", &pgconn.PgError{Code: "08006"}, true},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"statement timeout", &pgconn.PgError{Code: "57014"}, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true},
		{"pg conn closed", fmt.Errorf("x: %w", pgconn.ErrConnClosed), true},
		{"redis pool timeout", redis.ErrPoolTimeout, true},
		{"redis closed", redis.ErrClosed, true},
		{"redis nil", redis.Nil, false},
	} {
		if got := backend.IsUnavailable(c.err); got != c.want {
			t.Errorf("%s (%v): %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// TestIsUnavailableRealFailures: the errors pgx and go-redis return for a
// server that is not there, and for a closed pool, are unavailability.
func TestIsUnavailableRealFailures(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	_, err = pgconn.Connect(ctx, "postgres://u@"+addr+"/db?connect_timeout=2")
	if !backend.IsUnavailable(err) {
		t.Errorf("PostgreSQL not there: %T %v is not unavailability", err, err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	err = rdb.Ping(ctx).Err()
	if !backend.IsUnavailable(err) {
		t.Errorf("Redis not there: %T %v is not unavailability", err, err)
	}
	rdb.Close()
	if err := rdb.Ping(ctx).Err(); !backend.IsUnavailable(err) {
		t.Errorf("closed Redis client: %T %v is not unavailability", err, err)
	}
	pool, err := pgxpool.New(ctx, "postgres://u@"+addr+"/db")
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	if _, err := pool.Exec(ctx, "SELECT 1"); !backend.IsUnavailable(err) {
		t.Errorf("closed pool: %T %v is not unavailability", err, err)
	}
}

// TestIsUnavailableNoScript: a NOSCRIPT reply (the script did not run: a
// node that lost its scripts, say a replica just promoted) is
// unavailability; the same words in an error of another type are not.
func TestIsUnavailableNoScript(t *testing.T) {
	rdb, _ := testenv.RedisClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := rdb.EvalSha(ctx, "0000000000000000000000000000000000000000", nil).Err()
	if err == nil || !backend.IsUnavailable(err) {
		t.Errorf("EVALSHA of a script Redis does not have: %T %v is not unavailability", err, err)
	}
	if backend.IsUnavailable(fmt.Errorf("seq: %w", err)) != true {
		t.Errorf("wrapped NOSCRIPT is not unavailability")
	}
	if backend.IsUnavailable(errors.New("NOSCRIPT No matching script")) {
		t.Errorf("a plain error saying NOSCRIPT is unavailability")
	}
}
