// Package backend tells a backend that is down from everything else.
//
// A request that fails because PostgreSQL or Redis could not be reached,
// or did not answer in time, is answered UNAVAILABLE: nothing was
// committed and the client retries later. Every other failure is a bug
// (INTERNAL, logged with the request), never dressed as UNAVAILABLE.
// IsUnavailable decides between the two from the error's type alone,
// never from its text.
package backend

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
	"github.com/redis/go-redis/v9"
)

// ErrUnavailable marks a failure of Parley's own that means "retry
// later; nothing was committed" (a queue closed by a shutdown, a seq
// counter that kept being re-seeded). Wrap it with %w.
var ErrUnavailable = errors.New("backend unavailable")

// IsUnavailable reports whether err means a backend was unreachable or
// timed out:
//   - ErrUnavailable, context.DeadlineExceeded or context.Canceled (the
//     request's deadline, or a shutdown);
//   - a network error (net.Error, a connection closed or cut short);
//   - pgx: a failed connect, a timeout, a closed connection or pool
//     (a shutdown), an error
//     raised before anything was sent (pgconn.SafeToRetry), or a
//     PostgreSQL error of class 08 (connection exception), 53
//     (insufficient resources), 57P (shutting down, cannot connect now)
//     or 57014 (statement timeout);
//   - go-redis: a pool timeout or exhausted, a closed client, and the replies of a
//     server that cannot serve now (LOADING, CLUSTERDOWN, TRYAGAIN,
//     MASTERDOWN, READONLY during a failover, max clients; NOSCRIPT: the
//     script did not run, on a node that lost its scripts, such as a
//     replica promoted by a failover before they were loaded again; and
//     MOVED or ASK left over once the client's redirects ran out, while
//     slots move: the command did not run).
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) || pgconn.Timeout(err) || pgconn.SafeToRetry(err) || errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, puddle.ErrClosedPool) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		c := pgErr.Code
		return strings.HasPrefix(c, "08") || strings.HasPrefix(c, "53") || strings.HasPrefix(c, "57P") || c == "57014"
	}
	if _, moved := redis.IsMovedError(err); moved {
		return true
	}
	if _, ask := redis.IsAskError(err); ask || redis.HasErrorPrefix(err, "NOSCRIPT") {
		return true
	}
	return errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) || errors.Is(err, redis.ErrClosed) ||
		redis.IsLoadingError(err) || redis.IsClusterDownError(err) || redis.IsTryAgainError(err) ||
		redis.IsMasterDownError(err) || redis.IsReadOnlyError(err) || redis.IsMaxClientsError(err)
}
