package conn

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"sync"

	"github.com/gobwas/ws"

	"github.com/parley-im/parley/wire"
)

// The WebSocket transport (docs/protocol.md, "WebSocket"): the handshake
// and the framing run on the event loop, on the bytes as they arrive, with
// gobwas/ws's low-level pieces (the upgrader on a complete request, the
// header checks, the unmasking cipher). Each binary message carries one
// frame body, without the 4-byte length prefix of TCP; outgoing frames are
// turned into binary messages when the outbox is flushed.

const (
	wsPath     = "/v1/ws"
	wsProtocol = "parley.msgpack"
	// wsMaxHandshake bounds the upgrade request (request line and headers).
	wsMaxHandshake = 8192
	// wsMaxFragments bounds the frames of one fragmented message, so that a
	// message of empty continuation frames cannot go on for ever.
	wsMaxFragments = 1024
)

// wsConn is the WebSocket state of a session (nil for TCP).
type wsConn struct {
	// Owned by the event loop.
	upgraded bool
	reader   wsReader

	// Guarded by the session's omu.
	closeCode ws.StatusCode // the close frame to send after the final frame
	closeSent bool          // a close frame went out: nothing more is written
}

// wsEventKind says what one client frame amounted to.
type wsEventKind uint8

const (
	wsNothing wsEventKind = iota // a fragment or a pong: nothing to do
	wsBinary                     // a complete binary message
	wsText                       // a complete text message
	wsPing                       // a ping: answer with pong
	wsClose                      // a close: answer with close, then close
)

// wsEvent is one client frame's outcome; payload is valid until the
// frame's bytes are discarded (or the next call for a reassembled one).
type wsEvent struct {
	kind    wsEventKind
	payload []byte
	code    ws.StatusCode // wsClose: the client's code
}

// wsError is a frame that breaks the protocol or the limits: the close
// code to send, the metric's reason, and (for TOO_LARGE) the wire error
// that precedes the close.
type wsError struct {
	code   ws.StatusCode
	reason string
	msg    string
}

func (e *wsError) Error() string { return e.msg }

// wsReader reassembles the client's messages from frames as bytes arrive.
// Owned by the event loop.
type wsReader struct {
	fragOp    ws.OpCode // opcode of the fragmented message in progress (0: none)
	frag      []byte    // its payload so far
	fragCount int       // its frames so far
}

// next reads one frame from the start of b. n is the bytes it consumed: 0
// means b holds no complete frame yet (b's length is never waited for
// beyond maxMsg: an oversized message is refused from its header).
// Unmasking happens in place in b.
func (r *wsReader) next(b []byte, maxMsg int) (ev wsEvent, n int, err *wsError) {
	if len(b) < 2 {
		return ev, 0, nil
	}
	h := ws.Header{
		Fin:    b[0]&0x80 != 0,
		Rsv:    (b[0] & 0x70) >> 4,
		OpCode: ws.OpCode(b[0] & 0x0f),
		Masked: b[1]&0x80 != 0,
	}
	hl := 2
	switch l := b[1] & 0x7f; l {
	case 126:
		if len(b) < 4 {
			return ev, 0, nil
		}
		h.Length = int64(binary.BigEndian.Uint16(b[2:4]))
		hl = 4
	case 127:
		if len(b) < 10 {
			return ev, 0, nil
		}
		u := binary.BigEndian.Uint64(b[2:10])
		if u>>63 != 0 {
			return ev, 0, &wsError{ws.StatusProtocolError, "protocol", "frame length with its top bit set"}
		}
		h.Length = int64(u)
		hl = 10
	default:
		h.Length = int64(l)
	}
	if h.Masked {
		hl += 4
	}
	if len(b) < hl {
		return ev, 0, nil
	}
	state := ws.StateServerSide
	if r.fragOp != 0 {
		state = state.Set(ws.StateFragmented)
	}
	if cerr := ws.CheckHeader(h, state); cerr != nil {
		reason := "protocol"
		if errors.Is(cerr, ws.ErrProtocolMaskRequired) {
			reason = "unmasked"
		}
		return ev, 0, &wsError{ws.StatusProtocolError, reason, cerr.Error()}
	}
	if !h.OpCode.IsControl() {
		if h.Length+int64(len(r.frag)) > int64(maxMsg) {
			return ev, 0, &wsError{ws.StatusMessageTooBig, "too_large", "message larger than max_frame"}
		}
		if (!h.Fin || h.OpCode == ws.OpContinuation) && r.fragCount+1 > wsMaxFragments {
			return ev, 0, &wsError{ws.StatusMessageTooBig, "fragments", "message in too many fragments"}
		}
	}
	if int64(len(b)-hl) < h.Length {
		return ev, 0, nil
	}
	copy(h.Mask[:], b[hl-4:hl])
	n = hl + int(h.Length)
	payload := b[hl:n]
	ws.Cipher(payload, h.Mask, 0)
	switch h.OpCode {
	case ws.OpPing:
		return wsEvent{kind: wsPing, payload: payload}, n, nil
	case ws.OpPong:
		return ev, n, nil
	case ws.OpClose:
		code := ws.StatusNoStatusRcvd
		if len(payload) == 1 {
			return ev, 0, &wsError{ws.StatusProtocolError, "protocol", "close frame of one byte"}
		}
		if len(payload) >= 2 {
			c, reason := ws.ParseCloseFrameDataUnsafe(payload)
			if cerr := ws.CheckCloseFrameData(c, reason); cerr != nil {
				return ev, 0, &wsError{ws.StatusProtocolError, "protocol", cerr.Error()}
			}
			code = c
		}
		return wsEvent{kind: wsClose, code: code}, n, nil
	case ws.OpContinuation:
		r.frag = append(r.frag, payload...)
		r.fragCount++
		if !h.Fin {
			return ev, n, nil
		}
		ev = wsEvent{kind: wsBinary, payload: r.frag}
		if r.fragOp == ws.OpText {
			ev.kind = wsText
		}
		r.fragOp, r.frag, r.fragCount = 0, nil, 0
		return ev, n, nil
	}
	// A data frame that starts a message.
	if !h.Fin {
		r.fragOp, r.fragCount = h.OpCode, 1
		r.frag = append(make([]byte, 0, len(payload)*2), payload...)
		return ev, n, nil
	}
	if h.OpCode == ws.OpText {
		return wsEvent{kind: wsText, payload: payload}, n, nil
	}
	return wsEvent{kind: wsBinary, payload: payload}, n, nil
}

// wsHandshakeLen returns the length of the HTTP request at the start of b
// (through the blank line), 0 if it is not complete yet, or -1 if it is
// longer than wsMaxHandshake.
func wsHandshakeLen(b []byte) int {
	if i := bytes.Index(b[:min(len(b), wsMaxHandshake)], []byte("\r\n\r\n")); i >= 0 {
		return i + 4
	}
	if len(b) >= wsMaxHandshake {
		return -1
	}
	return 0
}

// newWSUpgrader returns the gateway's upgrader (static: its callbacks
// keep no per-request state, so the event loops share it).
func (g *Gateway) newWSUpgrader() ws.Upgrader {
	return ws.Upgrader{
		ReadBufferSize: wsMaxHandshake,
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

// wsMessagesInPlace turns the length-prefixed frames in frames into
// binary WebSocket messages in the same buffer, if every frame is at most
// 65535 bytes (its message header is then no longer than the 4-byte
// prefix it replaces); otherwise it returns false and leaves frames as
// they were.
func wsMessagesInPlace(frames []byte) ([]byte, bool) {
	for r := 0; r+wire.HeaderLen <= len(frames); {
		n := int(binary.BigEndian.Uint32(frames[r:]))
		if n > 0xffff {
			return frames, false
		}
		r += wire.HeaderLen + n
	}
	w := 0
	for r := 0; r+wire.HeaderLen <= len(frames); {
		n := int(binary.BigEndian.Uint32(frames[r:]))
		// The header ends at or before r+4, where this payload begins:
		// writing it never overwrites bytes still to be moved.
		var hdr [4]byte
		h := appendWSHeader(hdr[:0], ws.OpBinary, n)
		w += copy(frames[w:], h)
		w += copy(frames[w:], frames[r+wire.HeaderLen:r+wire.HeaderLen+n])
		r += wire.HeaderLen + n
	}
	return frames[:w], true
}

// appendWSMessages appends each length-prefixed frame in frames as one
// binary WebSocket message (unmasked: the server's side).
func appendWSMessages(dst, frames []byte) []byte {
	for len(frames) >= wire.HeaderLen {
		n := int(binary.BigEndian.Uint32(frames))
		body := frames[wire.HeaderLen : wire.HeaderLen+n]
		dst = appendWSHeader(dst, ws.OpBinary, len(body))
		dst = append(dst, body...)
		frames = frames[wire.HeaderLen+n:]
	}
	return dst
}

// appendWSHeader appends the header of an unmasked final frame of op with
// an n-byte payload.
func appendWSHeader(dst []byte, op ws.OpCode, n int) []byte {
	dst = append(dst, 0x80|byte(op))
	switch {
	case n < 126:
		return append(dst, byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(dst, 126), uint16(n))
	default:
		return binary.BigEndian.AppendUint64(append(dst, 127), uint64(n))
	}
}

// appendWSControl appends a control frame (ping, pong, close) with payload
// p (at most 125 bytes).
func appendWSControl(dst []byte, op ws.OpCode, p []byte) []byte {
	return append(appendWSHeader(dst, op, len(p)), p...)
}

// appendWSClose appends a close frame with code (and no reason).
func appendWSClose(dst []byte, code ws.StatusCode) []byte {
	return appendWSControl(dst, ws.OpClose, binary.BigEndian.AppendUint16(nil, uint16(code)))
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
