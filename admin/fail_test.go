package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/wire"
)

// TestFailClassifies: an admin request's error is 503 UNAVAILABLE only
// when a backend was unreachable or timed out, 500 INTERNAL (logged) when
// nobody classified it, and the client's own mistakes keep their 4xx.
func TestFailClassifies(t *testing.T) {
	var logged bytes.Buffer
	a := &API{logger: slog.New(slog.NewTextHandler(&logged, nil))}
	for _, c := range []struct {
		err    error
		status int
		code   wire.Code
	}{
		{errors.New("something nobody expected"), http.StatusInternalServerError, wire.Internal},
		{fmt.Errorf("store: %w", context.DeadlineExceeded), http.StatusServiceUnavailable, wire.Unavailable},
		{fmt.Errorf("%w: g", store.ErrExists), http.StatusConflict, wire.Exists},
		{store.ErrNotFound, http.StatusNotFound, wire.NotFound},
		{fmt.Errorf("%w: zed", store.ErrUnknownUser), http.StatusNotFound, wire.NotFound},
		{store.ErrNotMember, http.StatusNotFound, wire.NotFound},
	} {
		logged.Reset()
		w := httptest.NewRecorder()
		a.fail(w, httptest.NewRequest("POST", "/v1/conversations/g/members", nil), c.err)
		var body struct{ Code, Msg string }
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if w.Code != c.status || body.Code != string(c.code) {
			t.Errorf("%v: %d %s, want %d %s", c.err, w.Code, body.Code, c.status, c.code)
		}
		if c.code == wire.Internal && !strings.Contains(logged.String(), "level=ERROR") {
			t.Errorf("%v: not logged as an error: %q", c.err, logged.String())
		}
	}
}
