package conn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/internal/batch"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/wire"
)

// TestWireErrorClassifies: a request's error becomes UNAVAILABLE only when
// a backend was unreachable or timed out; an error nobody classified is
// INTERNAL and is logged with the request; the store's refusals keep their
// codes.
func TestWireErrorClassifies(t *testing.T) {
	var logged bytes.Buffer
	g := &Gateway{cfg: config.Default(), log: slog.New(slog.NewTextHandler(&logged, nil))}
	s := &Session{device: "ana-d1"}
	req := &wire.Request{T: wire.TSend, Rid: "r7", Conv: "c9"}
	for _, c := range []struct {
		err  error
		want wire.Code
	}{
		{errors.New("something nobody expected"), wire.Internal},
		{&pgconn.PgError{Code: "23502", Message: "null value"}, wire.Internal},
		{fmt.Errorf("seq: %w", context.DeadlineExceeded), wire.Unavailable},
		{&pgconn.PgError{Code: "57P01"}, wire.Unavailable},
		{batch.ErrClosed, wire.Unavailable},
		{eventlog.ErrRetries, wire.Unavailable},
		{store.ErrNotMember, wire.NotMember},
		{store.ErrNotFound, wire.NotMember},
		{fmt.Errorf("%w: zed", store.ErrUnknownUser), wire.NotFound},
		{store.ErrCursorAhead, wire.CursorAhead},
		{store.ErrExists, wire.Exists},
	} {
		logged.Reset()
		e := g.wireError(s, req, c.err)
		if e.Code != c.want {
			t.Errorf("%v: %s, want %s", c.err, e.Code, c.want)
		}
		if c.want == wire.Internal {
			out := logged.String()
			for _, part := range []string{"level=ERROR", "type=send", "rid=r7", "conv=c9", "device=ana-d1", c.err.Error()} {
				if !strings.Contains(out, part) {
					t.Errorf("%v: logged %q, which lacks %q", c.err, out, part)
				}
			}
			if strings.Contains(e.Msg, c.err.Error()) {
				t.Errorf("%v: the client is told %q, the server's own error", c.err, e.Msg)
			}
		}
	}
}
