package conn

import (
	"bytes"
	"errors"
	"strings"
	"sync"

	"github.com/gobwas/ws"

	"github.com/parley-im/parley/conn/wsframe"
	"github.com/parley-im/parley/wire"
)

// The WebSocket transport (docs/protocol.md, "WebSocket"): the handshake
// and the framing (package wsframe) run on the event loop, on the bytes as
// they arrive, with gobwas/ws's low-level pieces (the upgrader on a
// complete request, the header checks, the unmasking cipher). Each binary message carries one
// frame body, without the 4-byte length prefix of TCP; outgoing frames are
// turned into binary messages when the outbox is flushed.

const (
	wsPath     = "/v1/ws"
	wsProtocol = "parley.msgpack"
)

// wsConn is the WebSocket state of a session (nil for TCP).
type wsConn struct {
	// Owned by the event loop.
	upgraded bool
	reader   wsframe.Reader

	// Guarded by the session's omu.
	closeCode ws.StatusCode // the close frame to send after the final frame
	closeSent bool          // a close frame went out: nothing more is written
}

// newWSUpgrader returns the gateway's upgrader (static: its callbacks
// keep no per-request state, so the event loops share it).
func (g *Gateway) newWSUpgrader() ws.Upgrader {
	return ws.Upgrader{
		ReadBufferSize: wsframe.MaxHandshake,
		OnRequest: func(uri []byte) error {
			path, _, _ := bytes.Cut(uri, []byte("?"))
			if string(path) != wsPath {
				return ws.RejectConnectionError(ws.RejectionStatus(404), ws.RejectionReason("the WebSocket endpoint is "+wsPath))
			}
			return nil
		},
		OnHeader: func(key, value []byte) error {
			if len(g.wsOrigins) == 0 || !strings.EqualFold(string(key), "Origin") {
				return nil
			}
			for _, o := range g.wsOrigins {
				if strings.EqualFold(o, string(value)) {
					return nil
				}
			}
			return ws.RejectConnectionError(ws.RejectionStatus(403), ws.RejectionReason("origin not allowed"))
		},
		Protocol: func(p []byte) bool { return string(p) == wsProtocol },
	}
}

// wsHandshakeIO is the upgrader's view of one request: the request's
// bytes to read, the response to write. Pooled: the handshakes of many
// connections leave little garbage behind.
type wsHandshakeIO struct {
	bytes.Reader
	out bytes.Buffer
}

func (h *wsHandshakeIO) Write(p []byte) (int, error) { return h.out.Write(p) }

var wsHandshakes = sync.Pool{New: func() any { return new(wsHandshakeIO) }}

// wsUpgrade answers the complete upgrade request req: it writes the HTTP
// response with write, and says whether the connection is now a
// WebSocket (if not, reason says why, for the metric, and the connection
// is closed after the response).
func (g *Gateway) wsUpgrade(req []byte, write func([]byte)) (reason string, ok bool) {
	h := wsHandshakes.Get().(*wsHandshakeIO)
	defer wsHandshakes.Put(h)
	h.Reset(req)
	h.out.Reset()
	_, err := g.wsUpgrader.Upgrade(h)
	write(h.out.Bytes())
	if err == nil {
		return "", true
	}
	var rej *ws.ConnectionRejectedError
	if errors.As(err, &rej) {
		switch rej.StatusCode() {
		case 404:
			return "path", false
		case 403:
			return "origin", false
		}
	}
	return "bad_request", false
}

// wsCloseCode is the close code that follows a final frame: the error's
// code says why the server ends the connection.
func wsCloseCode(v any) ws.StatusCode {
	switch f := v.(type) {
	case wire.Kick:
		if f.Reason == "shutdown" {
			return ws.StatusGoingAway
		}
		return ws.StatusNormalClosure
	case wire.ErrorFrame:
		switch wire.Code(f.Code) {
		case wire.TooLarge:
			return ws.StatusMessageTooBig
		case wire.RateLimited:
			return 1013 // try again later
		case wire.Internal:
			return ws.StatusInternalServerError
		}
		return ws.StatusPolicyViolation
	}
	return ws.StatusNormalClosure
}
