package main

import (
	"context"
	"errors"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/wire"
)

// describe turns a command's error into (exit status, JSON, text).
func describe(err error) (int, errorJSON, string) {
	var ue *usageError
	var un *unreachableError
	switch we, isWire := wire.AsError(err); {
	case errors.As(err, &ue):
		return exitUsage, errorJSON{Error: "USAGE", Msg: ue.msg}, ue.msg
	case isWire:
		return exitRefused, errorJSON{Error: string(we.Code), Msg: we.Msg, RetryAfterMs: we.RetryAfterMs}, "error: " + we.Error()
	case errors.Is(err, client.ErrReplaced):
		return exitRefused, errorJSON{Error: "REPLACED", Msg: err.Error()}, "error: " + err.Error()
	case errors.As(err, &un):
		return exitUnreachable, errorJSON{Error: "UNREACHABLE", Msg: un.Error()}, "error: " + un.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return exitUnreachable, errorJSON{Error: "UNREACHABLE", Msg: "no answer in time"}, "error: no answer in time"
	default:
		return exitUnreachable, errorJSON{Error: "UNREACHABLE", Msg: err.Error()}, "error: " + err.Error()
	}
}
