// Package errcode decides which protocol error code answers an error: one
// table for the requests on the wire (docs/protocol.md §6) and the admin
// API (§7), so that the two cannot drift apart. Errors are told apart by
// their types and sentinels (errors.Is and errors.As, and
// backend.IsUnavailable for a backend that is down), never by their text.
package errcode

import (
	"errors"
	"net/http"

	"github.com/parley-im/parley/internal/backend"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/wire"
)

// Class says whose an error is.
type Class int

const (
	// Client: the request was refused; its code tells the client why.
	Client Class = iota
	// Outage: a backend was unreachable or timed out (UNAVAILABLE):
	// nothing was committed, and the client retries later.
	Outage
	// Bug: nobody classified the error (INTERNAL): it is logged with the
	// request.
	Bug
)

// Of returns the code that answers err on the wire, and its class. A
// *wire.Error keeps its own code.
func Of(err error) (wire.Code, Class) {
	if e, ok := wire.AsError(err); ok {
		return e.Code, Client
	}
	switch {
	case errors.Is(err, store.ErrForbidden):
		return wire.Forbidden, Client
	// An unknown conversation answers as one the caller is not in, so
	// that conversation ids cannot be probed.
	case errors.Is(err, store.ErrNotMember), errors.Is(err, store.ErrNotFound):
		return wire.NotMember, Client
	case errors.Is(err, store.ErrUnknownUser), errors.Is(err, store.ErrNoMessage):
		return wire.NotFound, Client
	case errors.Is(err, store.ErrExists):
		return wire.Exists, Client
	case errors.Is(err, store.ErrStaleInstall):
		return wire.StaleInstall, Client
	case errors.Is(err, store.ErrCursorAhead):
		return wire.CursorAhead, Client
	case errors.Is(err, store.ErrNotSender):
		return wire.NotSender, Client
	case errors.Is(err, store.ErrRecallWindow):
		return wire.RecallWindow, Client
	case errors.Is(err, store.ErrEditWindow):
		return wire.EditWindow, Client
	case backend.IsUnavailable(err):
		return wire.Unavailable, Outage
	}
	return wire.Internal, Bug
}

// Admin returns the code and HTTP status that answer err in the admin API:
// Of's code, but NOT_MEMBER is answered 404 NOT_FOUND there (§7: an
// operator may name any conversation, so there is no id to hide, and the
// admin API has no NOT_MEMBER).
func Admin(err error) (wire.Code, int, Class) {
	code, class := Of(err)
	if code == wire.NotMember {
		code = wire.NotFound
	}
	return code, Status(code), class
}

// Status is the HTTP status of an admin API error with code (§7).
func Status(code wire.Code) int {
	switch code {
	case wire.BadRequest, wire.BadFrame, wire.TooLarge:
		return http.StatusBadRequest
	case wire.Unauthenticated, wire.AuthFailed, wire.TokenExpired:
		return http.StatusUnauthorized
	case wire.NotFound, wire.NotMember:
		return http.StatusNotFound
	case wire.Forbidden, wire.Suspended:
		return http.StatusForbidden
	case wire.Exists, wire.StaleInstall, wire.CursorAhead, wire.NotSender, wire.RecallWindow, wire.EditWindow:
		return http.StatusConflict
	case wire.RateLimited:
		return http.StatusTooManyRequests
	case wire.Unavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}
