// Package store is Parley's authoritative store in PostgreSQL (pgx v5):
// users, devices, conversations and membership periods, the event log,
// delivery cursors and read positions. An event exists once it is
// committed here; everything in Redis can be rebuilt from it.
//
// The store knows nothing of Redis, gateways or the wire format: callers
// allocate seqs and pass them in; a seq that is already taken comes back
// as a per-row result (or ErrSeqTaken) for the caller to retry.
package store

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Sentinel errors; callers check them with errors.Is.
var (
	ErrNotFound  = errors.New("store: not found")
	ErrExists    = errors.New("store: already exists")
	ErrNotMember = errors.New("store: not a member")
	// ErrUnknownUser: a user named in a membership change does not exist.
	ErrUnknownUser = errors.New("store: unknown user")
	// ErrSeqTaken means the seq the caller allocated is already used in
	// that conversation (a re-seeded counter, or a hole tombstone written
	// by a reader); allocate a new one and retry.
	ErrSeqTaken = errors.New("store: seq already taken")
)

// NotMemberError names the user of a request about another member (a
// role change, a member mute) who is not a current member. It is
// ErrNotMember to errors.Is.
type NotMemberError struct{ User string }

func (e *NotMemberError) Error() string { return "store: not a member: " + e.User }

// Is makes errors.Is(err, ErrNotMember) true.
func (e *NotMemberError) Is(target error) bool { return target == ErrNotMember }

// Store is a pool of connections to the authoritative database.
type Store struct {
	pool *pgxpool.Pool
	// snapshots runs the snapshot statements, and nothing else. Each
	// connection that first runs one plans it, which takes PostgreSQL
	// tens of milliseconds (the unread count is inlined into it); spread
	// over the main pool, a reconnect storm after a start planned it on
	// a dozen connections. The gateway runs at most snapshotConns at once.
	// PlanSnapshots opens them and plans it when the server starts: after
	// a gateway starts, its first snapshots are a reconnect storm's.
	snapshots *pgxpool.Pool
}

// snapshotConns is the size of the snapshot statements' pool: the
// gateway's snapshot batches that may run at once.
const snapshotConns = 4

// Open connects to url and checks the connection.
func Open(ctx context.Context, url string, maxConns int) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = int32(maxConns)
	}
	// JIT compiles a query whose estimated cost is high, which the page
	// queries' unread counting (many small index scans, estimated as big)
	// can reach, and compiling then takes far longer than it saves
	// (BENCHMARKS.md, the row "at c50e6ef" on JIT). Statements here are
	// short OLTP ones; an operator's own setting in the URL wins.
	if _, ok := cfg.ConnConfig.RuntimeParams["jit"]; !ok {
		cfg.ConnConfig.RuntimeParams["jit"] = "off"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	scfg := cfg.Copy()
	scfg.MaxConns, scfg.MinConns = snapshotConns, snapshotConns
	snapshots, err := pgxpool.NewWithConfig(ctx, scfg)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	return &Store{pool: pool, snapshots: snapshots}, nil
}

// Close closes every connection.
func (s *Store) Close() {
	s.snapshots.Close()
	s.pool.Close()
}

// Ping checks that PostgreSQL answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

// Stat reports pool statistics (for metrics).
func (s *Store) Stat() *pgxpool.Stat { return s.pool.Stat() }

// Migrate applies every migration in migrations/ that the database has
// not seen yet, in name order, each in its own transaction, under an
// advisory lock so several parleyd processes can start at once.
func (s *Store) Migrate(ctx context.Context) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	const lockID = 0x7061726c6579 // "parley"
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockID); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, lockID) //nolint:errcheck
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		base := strings.TrimPrefix(name, "migrations/")
		var done bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE name = $1)`, base).Scan(&done); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		if done {
			continue
		}
		sql, err := migrations.ReadFile(name)
		if err != nil {
			return err
		}
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, string(sql)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (name) VALUES ($1)`, base)
			return err
		})
		if err != nil {
			return fmt.Errorf("migrate %s: %w", base, err)
		}
	}
	return nil
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// readTx runs f in a REPEATABLE READ read-only transaction: every query in
// it sees one snapshot.
func (s *Store) readTx(ctx context.Context, f func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, f)
}

func isForeignKeyViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23503"
}
