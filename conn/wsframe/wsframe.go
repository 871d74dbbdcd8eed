// Package wsframe is the WebSocket framing of the gateway's WebSocket
// transport (docs/protocol.md, "WebSocket"), run on the event loop over
// the bytes as they arrive: Reader reassembles the client's messages from
// masked frames, refusing what breaks RFC 6455 or the limits, and the
// Append functions turn the gateway's length-prefixed outgoing frames into
// unmasked binary messages. gobwas/ws supplies the header checks and the
// unmasking cipher.
package wsframe

import (
	"bytes"
	"encoding/binary"
	"errors"

	"github.com/gobwas/ws"

	"github.com/parley-im/parley/wire"
)

const (
	// MaxHandshake bounds the upgrade request (request line and headers).
	MaxHandshake = 8192
	// MaxFragments bounds the frames of one fragmented message, so that a
	// message of empty continuation frames cannot go on for ever.
	MaxFragments = 1024
)

// Kind says what one client frame amounted to.
type Kind uint8

const (
	Nothing Kind = iota // a fragment or a pong: nothing to do
	Binary              // a complete binary message
	Text                // a complete text message
	Ping                // a ping: answer with pong
	Close               // a close: answer with close, then close
)

// Event is one client frame's outcome; payload is valid until the
// frame's bytes are discarded (or the next call for a reassembled one).
type Event struct {
	Kind    Kind
	Payload []byte
	Code    ws.StatusCode // Close: the client's code
}

// Error is a frame that breaks the protocol or the limits: the close
// code to send, the metric's reason, and (for TOO_LARGE) the wire error
// that precedes the close.
type Error struct {
	Code   ws.StatusCode // the close code to send
	Reason string        // the metric's label
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// Reader reassembles the client's messages from frames as bytes arrive.
// Owned by the event loop.
type Reader struct {
	fragOp    ws.OpCode // opcode of the fragmented message in progress (0: none)
	frag      []byte    // its payload so far
	fragCount int       // its frames so far
}

// Next reads one frame from the start of b. n is the bytes it consumed: 0
// means b holds no complete frame yet (b's length is never waited for
// beyond maxMsg: an oversized message is refused from its header).
// Unmasking happens in place in b.
func (r *Reader) Next(b []byte, maxMsg int) (ev Event, n int, err *Error) {
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
			return ev, 0, &Error{ws.StatusProtocolError, "protocol", "frame length with its top bit set"}
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
		return ev, 0, &Error{ws.StatusProtocolError, reason, cerr.Error()}
	}
	if !h.OpCode.IsControl() {
		if h.Length+int64(len(r.frag)) > int64(maxMsg) {
			return ev, 0, &Error{ws.StatusMessageTooBig, "too_large", "message larger than max_frame"}
		}
		if (!h.Fin || h.OpCode == ws.OpContinuation) && r.fragCount+1 > MaxFragments {
			return ev, 0, &Error{ws.StatusMessageTooBig, "fragments", "message in too many fragments"}
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
		return Event{Kind: Ping, Payload: payload}, n, nil
	case ws.OpPong:
		return ev, n, nil
	case ws.OpClose:
		code := ws.StatusNoStatusRcvd
		if len(payload) == 1 {
			return ev, 0, &Error{ws.StatusProtocolError, "protocol", "close frame of one byte"}
		}
		if len(payload) >= 2 {
			c, reason := ws.ParseCloseFrameDataUnsafe(payload)
			if cerr := ws.CheckCloseFrameData(c, reason); cerr != nil {
				return ev, 0, &Error{ws.StatusProtocolError, "protocol", cerr.Error()}
			}
			code = c
		}
		return Event{Kind: Close, Code: code}, n, nil
	case ws.OpContinuation:
		r.frag = append(r.frag, payload...)
		r.fragCount++
		if !h.Fin {
			return ev, n, nil
		}
		ev = Event{Kind: Binary, Payload: r.frag}
		if r.fragOp == ws.OpText {
			ev.Kind = Text
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
		return Event{Kind: Text, Payload: payload}, n, nil
	}
	return Event{Kind: Binary, Payload: payload}, n, nil
}

// HandshakeLen returns the length of the HTTP request at the start of b
// (through the blank line), 0 if it is not complete yet, or -1 if it is
// longer than MaxHandshake.
func HandshakeLen(b []byte) int {
	if i := bytes.Index(b[:min(len(b), MaxHandshake)], []byte("\r\n\r\n")); i >= 0 {
		return i + 4
	}
	if len(b) >= MaxHandshake {
		return -1
	}
	return 0
}

// MessagesInPlace turns the length-prefixed frames in frames into
// binary WebSocket messages in the same buffer, if every frame is at most
// 65535 bytes (its message header is then no longer than the 4-byte
// prefix it replaces); otherwise it returns false and leaves frames as
// they were.
func MessagesInPlace(frames []byte) ([]byte, bool) {
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
		h := AppendHeader(hdr[:0], ws.OpBinary, n)
		w += copy(frames[w:], h)
		w += copy(frames[w:], frames[r+wire.HeaderLen:r+wire.HeaderLen+n])
		r += wire.HeaderLen + n
	}
	return frames[:w], true
}

// AppendMessages appends each length-prefixed frame in frames as one
// binary WebSocket message (unmasked: the server's side).
func AppendMessages(dst, frames []byte) []byte {
	for len(frames) >= wire.HeaderLen {
		n := int(binary.BigEndian.Uint32(frames))
		body := frames[wire.HeaderLen : wire.HeaderLen+n]
		dst = AppendHeader(dst, ws.OpBinary, len(body))
		dst = append(dst, body...)
		frames = frames[wire.HeaderLen+n:]
	}
	return dst
}

// AppendHeader appends the header of an unmasked final frame of op with
// an n-byte payload.
func AppendHeader(dst []byte, op ws.OpCode, n int) []byte {
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

// AppendControl appends a control frame (ping, pong, close) with payload
// p (at most 125 bytes).
func AppendControl(dst []byte, op ws.OpCode, p []byte) []byte {
	return append(AppendHeader(dst, op, len(p)), p...)
}

// AppendClose appends a close frame with code (and no reason).
func AppendClose(dst []byte, code ws.StatusCode) []byte {
	return AppendControl(dst, ws.OpClose, binary.BigEndian.AppendUint16(nil, uint16(code)))
}
