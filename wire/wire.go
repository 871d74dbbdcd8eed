// Package wire is Parley's frame format: length-prefixed msgpack maps, the
// request and reply types, and the error codes of docs/protocol.md. It imports
// neither gnet nor the store; the gateway, the client library and the load
// tester all use it.
//
// A frame is a 4-byte big-endian length N followed by N bytes holding one
// msgpack map with string keys. NextFrame splits frames out of a receive
// buffer (server side), FrameReader does the same over an io.Reader (client
// side). DecodeRequest decodes a client→server body without trusting any
// length the input claims; AppendFrame encodes any frame type of this package
// (or any other msgpack-encodable value) behind a length prefix.
package wire

import (
	"encoding/binary"
	"io"
)

// HeaderLen is the size of the big-endian length prefix of every frame.
const HeaderLen = 4

// DefaultMaxFrame is the protocol's default max_frame (docs/protocol.md §1).
// It is used by NextFrame and NewFrameReader when they are given max <= 0.
const DefaultMaxFrame = 65536

// NextFrame looks at buf (the bytes received so far). It returns
//
//   - (body, consumed, nil) for one complete frame: body aliases buf (capacity
//     clipped to the body), consumed = HeaderLen + len(body);
//   - (nil, 0, nil) if more bytes are needed;
//   - (nil, 0, *Error) with Code BadFrame when the declared length is 0, or
//     TooLarge when it exceeds max. Both are decided from the 4 header bytes
//     alone, before the body has arrived; either breaks the framing.
//
// max <= 0 means DefaultMaxFrame.
func NextFrame(buf []byte, max int) (body []byte, consumed int, err error) {
	if len(buf) < HeaderLen {
		return nil, 0, nil
	}
	n := uint64(binary.BigEndian.Uint32(buf))
	if n == 0 {
		return nil, 0, &Error{Code: BadFrame, Msg: "frame length 0"}
	}
	if max <= 0 {
		max = DefaultMaxFrame
	}
	if n > uint64(max) {
		return nil, 0, Errorf(TooLarge, "frame length %d exceeds %d", n, max)
	}
	end := HeaderLen + int(n)
	if len(buf) < end {
		return nil, 0, nil
	}
	return buf[HeaderLen:end:end], end, nil
}

// FrameReader reads frames from a byte stream (a client's connection). It
// buffers reads, so several frames that arrive together cost one Read.
type FrameReader struct {
	r     io.Reader
	max   int
	buf   []byte // buf[start:end] holds received bytes not yet returned
	start int
	end   int
	err   error // sticky read error
}

// NewFrameReader returns a FrameReader over r that rejects frames whose
// declared length exceeds max (max <= 0 means DefaultMaxFrame).
func NewFrameReader(r io.Reader, max int) *FrameReader {
	if max <= 0 {
		max = DefaultMaxFrame
	}
	return &FrameReader{r: r, max: max, buf: make([]byte, 4096)}
}

// Next returns the body of the next frame. The slice aliases an internal
// buffer and is valid only until the next call of Next. At a clean end of
// stream (between frames) it returns io.EOF; a stream that ends inside a
// frame gives io.ErrUnexpectedEOF. A zero or oversized declared length gives
// an *Error (BadFrame or TooLarge); the stream cannot be resynchronised after
// that, and every later call returns the same error.
func (fr *FrameReader) Next() ([]byte, error) {
	for {
		body, n, err := NextFrame(fr.buf[fr.start:fr.end], fr.max)
		if err != nil {
			fr.err = err
			return nil, err
		}
		if n > 0 {
			fr.start += n
			return body, nil
		}
		if fr.err != nil {
			if fr.err == io.EOF && fr.end > fr.start {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, fr.err
		}
		fr.fill()
	}
}

// fill reads at least one more byte into the buffer (or records an error),
// first compacting it and growing it to hold the pending frame.
func (fr *FrameReader) fill() {
	pending := fr.end - fr.start
	need := HeaderLen
	if pending >= HeaderLen {
		// NextFrame has already checked the length against max.
		need = HeaderLen + int(binary.BigEndian.Uint32(fr.buf[fr.start:]))
	}
	if fr.start > 0 && (pending == 0 || fr.start+need > len(fr.buf)) {
		copy(fr.buf, fr.buf[fr.start:fr.end])
		fr.start, fr.end = 0, pending
	}
	if need > len(fr.buf)-fr.start {
		nb := make([]byte, max(need, 2*len(fr.buf)))
		fr.end = copy(nb, fr.buf[fr.start:fr.end])
		fr.start = 0
		fr.buf = nb
	}
	for range 100 {
		n, err := fr.r.Read(fr.buf[fr.end:])
		fr.end += n
		if err != nil {
			fr.err = err
			return
		}
		if n > 0 {
			return
		}
	}
	fr.err = io.ErrNoProgress
}
