package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/wire"
)

// A request's deadline (request_timeout) bounds the work done for it,
// including the group commit it shares with other requests: a send or a
// read whose PostgreSQL statement is held up past request_timeout is
// answered UNAVAILABLE at about request_timeout (before, the commit ran
// under a fresh 10 s deadline of its own). The send then goes through
// when retried with its cmid, stored once.
func TestCommitKeepsTheRequestsDeadline(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	cfg.RequestTimeout = time.Second
	env := parleytest.Start(t, cfg)
	ana := env.User(t, "ana", 1)[0]
	env.User(t, "ben", 1)
	env.Group(t, "g", "ana", "ben")
	c, _ := dial(t, env, ana)
	first, err := c.Send(ctx(t), "g", "warm", []byte("x")) // the membership check is cached
	if err != nil {
		t.Fatal(err)
	}

	pg, err := pgx.Connect(context.Background(), env.Cfg.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(context.Background()) })
	// hold locks table until release is called (at the latest when the
	// test ends).
	hold := func(table string) (release func()) {
		t.Helper()
		tx, err := pg.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(context.Background(), "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			t.Fatal(err)
		}
		done := false
		release = func() {
			if !done {
				done = true
				_ = tx.Rollback(context.Background())
			}
		}
		t.Cleanup(release)
		return release
	}
	// timed runs f with a client deadline well past request_timeout and
	// returns how long its answer took.
	timed := func(f func(context.Context) error) (time.Duration, error) {
		cctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		start := time.Now()
		err := f(cctx)
		return time.Since(start), err
	}
	const within = 4 * time.Second // request_timeout (1 s) and slack for a loaded test machine; the fresh deadline was 10 s

	release := hold("events")
	took, err := timed(func(cctx context.Context) error {
		_, err := c.Send(cctx, "g", "held", []byte("x"))
		return err
	})
	release()
	if wire.CodeOf(err) != wire.Unavailable || took > within {
		t.Fatalf("send held up by a lock on events: %v after %s, want UNAVAILABLE within %s", err, took, within)
	}
	r, err := c.Send(ctx(t), "g", "held", []byte("x"))
	if err != nil || r.Seq <= first.Seq {
		t.Fatalf("the retried send: %+v %v", r, err)
	}
	var stored int
	if err := pg.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE cmid = 'held'`).Scan(&stored); err != nil || stored != 1 {
		t.Fatalf("%d messages stored with cmid held (%v), want 1", stored, err)
	}

	release = hold("read_positions")
	took, err = timed(func(cctx context.Context) error {
		_, err := c.Read(cctx, "g", r.Seq)
		return err
	})
	release()
	if wire.CodeOf(err) != wire.Unavailable || took > within {
		t.Fatalf("read held up by a lock on read_positions: %v after %s, want UNAVAILABLE within %s", err, took, within)
	}
	if rr, err := c.Read(ctx(t), "g", r.Seq); err != nil || rr.Read != r.Seq {
		t.Fatalf("the retried read: %+v %v", rr, err)
	}
}
