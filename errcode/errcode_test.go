package errcode

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/wire"
)

// Every error a request can meet has one code, for the wire and the admin
// API alike; the admin API answers NOT_MEMBER as 404 NOT_FOUND (§7).
// Wrapping keeps the code; an error nobody classified is a bug.
func TestOneTableForWireAndAdmin(t *testing.T) {
	for _, c := range []struct {
		err         error
		wire, admin wire.Code
		status      int
		class       Class
	}{
		{&wire.Error{Code: wire.RateLimited, Msg: "slow down"}, wire.RateLimited, wire.RateLimited, http.StatusTooManyRequests, Client},
		{store.ErrForbidden, wire.Forbidden, wire.Forbidden, http.StatusForbidden, Client},
		{&store.ForbiddenError{Reason: "only admins may"}, wire.Forbidden, wire.Forbidden, http.StatusForbidden, Client},
		{store.MutedErr(1), wire.Forbidden, wire.Forbidden, http.StatusForbidden, Client},
		{store.ErrNotMember, wire.NotMember, wire.NotFound, http.StatusNotFound, Client},
		{&store.NotMemberError{User: "zed"}, wire.NotMember, wire.NotFound, http.StatusNotFound, Client},
		{store.ErrNotFound, wire.NotMember, wire.NotFound, http.StatusNotFound, Client},
		{fmt.Errorf("%w: zed", store.ErrUnknownUser), wire.NotFound, wire.NotFound, http.StatusNotFound, Client},
		{store.ErrNoMessage, wire.NotFound, wire.NotFound, http.StatusNotFound, Client},
		{fmt.Errorf("%w: g", store.ErrExists), wire.Exists, wire.Exists, http.StatusConflict, Client},
		{store.ErrStaleInstall, wire.StaleInstall, wire.StaleInstall, http.StatusConflict, Client},
		{store.ErrCursorAhead, wire.CursorAhead, wire.CursorAhead, http.StatusConflict, Client},
		{store.ErrNotSender, wire.NotSender, wire.NotSender, http.StatusConflict, Client},
		{store.ErrRecallWindow, wire.RecallWindow, wire.RecallWindow, http.StatusConflict, Client},
		{store.ErrEditWindow, wire.EditWindow, wire.EditWindow, http.StatusConflict, Client},
		{fmt.Errorf("store: %w", context.DeadlineExceeded), wire.Unavailable, wire.Unavailable, http.StatusServiceUnavailable, Outage},
		{redis.ErrPoolTimeout, wire.Unavailable, wire.Unavailable, http.StatusServiceUnavailable, Outage},
		{errors.New("something nobody expected"), wire.Internal, wire.Internal, http.StatusInternalServerError, Bug},
	} {
		code, class := Of(c.err)
		if code != c.wire || class != c.class {
			t.Errorf("%v: wire %s (class %d), want %s (%d)", c.err, code, class, c.wire, c.class)
		}
		code, status, class := Admin(fmt.Errorf("wrapped: %w", c.err))
		if code != c.admin || status != c.status || class != c.class {
			t.Errorf("%v: admin %d %s (class %d), want %d %s (%d)", c.err, status, code, class, c.status, c.admin, c.class)
		}
	}
}

// Every protocol code has an HTTP status, and those the admin API lists
// in §7 have theirs.
func TestStatusOfEveryCode(t *testing.T) {
	for _, code := range wire.Codes {
		if s := Status(code); s < 400 || (s == http.StatusInternalServerError && code != wire.Internal) {
			t.Errorf("%s: status %d", code, s)
		}
	}
	for code, want := range map[wire.Code]int{wire.BadRequest: 400, wire.Unauthenticated: 401, wire.NotFound: 404,
		wire.Exists: 409, wire.Forbidden: 403, wire.Unavailable: 503, wire.Internal: 500} {
		if s := Status(code); s != want {
			t.Errorf("%s: status %d, want %d (§7)", code, s, want)
		}
	}
}
