package wire

import (
	"errors"
	"fmt"
)

// Code is an error code of docs/protocol.md §6, sent as the `code` of an error
// frame.
type Code string

// The error codes of docs/protocol.md §6.
const (
	BadFrame        Code = "BAD_FRAME"       // framing broken or body not a decodable map with a known `t`
	TooLarge        Code = "TOO_LARGE"       // frame over max_frame, or send body over max_body
	BadRequest      Code = "BAD_REQUEST"     // a field of the wrong type, or a required field missing
	Unauthenticated Code = "UNAUTHENTICATED" // no auth first / in time, or a bad admin token
	AuthFailed      Code = "AUTH_FAILED"     // unknown device or bad token
	NotMember       Code = "NOT_MEMBER"      // not a member (or the conversation does not exist)
	CursorAhead     Code = "CURSOR_AHEAD"    // a seq/after beyond the conversation's head
	StaleInstall    Code = "STALE_INSTALL"   // ack from a connection of an older install
	NotFound        Code = "NOT_FOUND"       // no such message (recall) or entity (admin API)
	Exists          Code = "EXISTS"          // the id is taken
	NotSender       Code = "NOT_SENDER"      // only the sender may recall
	RecallWindow    Code = "RECALL_WINDOW"   // too late to recall
	EditWindow      Code = "EDIT_WINDOW"     // too late to edit
	Forbidden       Code = "FORBIDDEN"       // not allowed here (e.g. receipts outside the push tier)
	RateLimited     Code = "RATE_LIMITED"    // slow down; see RetryAfterMs
	Unavailable     Code = "UNAVAILABLE"     // a backend is down; nothing was committed
	Internal        Code = "INTERNAL"        // a server bug
	TokenExpired    Code = "TOKEN_EXPIRED"   // the JWT's exp passed (beyond the leeway)
	Suspended       Code = "SUSPENDED"       // the user is suspended
)

// Codes lists every error code, in docs/protocol.md order.
var Codes = []Code{
	BadFrame, TooLarge, BadRequest, Unauthenticated, AuthFailed, NotMember,
	CursorAhead, StaleInstall, NotFound, Exists, NotSender, RecallWindow,
	EditWindow, Forbidden, RateLimited, Unavailable, Internal, TokenExpired, Suspended,
}

// Valid reports whether c is one of the protocol's error codes.
func (c Code) Valid() bool {
	for _, k := range Codes {
		if c == k {
			return true
		}
	}
	return false
}

// Error is a wire error: what an `error` frame carries. RetryAfterMs is only
// meaningful for RATE_LIMITED.
type Error struct {
	Code         Code
	Msg          string
	RetryAfterMs int64
}

// Errorf returns an *Error with the given code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Error implements error: "CODE: msg" (or just "CODE").
func (e *Error) Error() string {
	if e.Msg == "" {
		return string(e.Code)
	}
	return string(e.Code) + ": " + e.Msg
}

// Is makes errors.Is(err, &Error{Code: c}) match any *Error with code c.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t != nil && e != nil && t.Code == e.Code
}

// AsError finds the first *Error in err's chain (errors.As).
func AsError(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) && e != nil {
		return e, true
	}
	return nil, false
}

// CodeOf returns the code of the first *Error in err's chain, "" for a nil
// error and Internal for any other error.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	if e, ok := AsError(err); ok {
		return e.Code
	}
	return Internal
}
