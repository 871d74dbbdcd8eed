package client

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"

	"github.com/gobwas/ws"

	"github.com/parley-im/parley/wire"
)

// WebSocket transport (docs/protocol.md, "WebSocket"): each binary message
// carries one frame body without the 4-byte length prefix. DialWebSocket
// returns a net.Conn that speaks the TCP framing on top of it, so Conn,
// Client and anything else written for TCP run over WebSocket unchanged.

// WSProtocol is the WebSocket subprotocol of Parley's frames.
const WSProtocol = "parley.msgpack"

// IsWebSocketURL reports whether addr is a ws:// or wss:// URL (Dial
// then connects over WebSocket) rather than a TCP host:port.
func IsWebSocketURL(addr string) bool {
	return strings.HasPrefix(addr, "ws://") || strings.HasPrefix(addr, "wss://")
}

// DialWebSocket opens a WebSocket to url (ws://host:port/v1/ws, or wss://
// with tlsConfig) through d (nil: a default dialer), offering the
// parley.msgpack subprotocol, and returns it as a length-prefixed frame
// stream: a Write of whole frames sends one binary message per frame, and
// Read returns each message received as a frame (length prefix added).
// Pings are answered; a close from the server ends the stream (io.EOF).
func DialWebSocket(ctx context.Context, url string, d *net.Dialer, tlsConfig *tls.Config) (net.Conn, error) {
	if d == nil {
		d = &net.Dialer{}
	}
	dialer := ws.Dialer{
		Protocols: []string{WSProtocol},
		TLSConfig: tlsConfig,
		NetDial:   d.DialContext,
	}
	nc, br, _, err := dialer.Dial(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("websocket %s: %w", url, err)
	}
	c := &wsStream{Conn: nc, br: bufio.NewReaderSize(nc, 4096)}
	if br != nil {
		// Bytes the server sent right behind its handshake response.
		c.br = bufio.NewReaderSize(io.MultiReader(br, nc), 4096)
	}
	return c, nil
}

// wsStream adapts a client WebSocket to the TCP frame stream.
type wsStream struct {
	net.Conn

	// Owned by the reader (Read).
	br    *bufio.Reader
	in    []byte // the frame being handed out by Read
	frag  []byte // a fragmented message so far
	eof   error
	hdr   [ws.MaxHeaderSize]byte
	wbufR []byte // the reader's control replies

	wmu     sync.Mutex // serializes writes (Write, and the reader's pongs)
	pending []byte     // a partial frame from the last Write
	wbuf    []byte
}

// Write sends every complete frame in b (and what earlier Writes left
// incomplete) as one binary message each, in one write to the socket.
func (c *wsStream) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	data := b
	if len(c.pending) > 0 {
		c.pending = append(c.pending, b...)
		data = c.pending
	}
	out := c.wbuf[:0]
	for len(data) >= wire.HeaderLen {
		n := int(binary.BigEndian.Uint32(data))
		if len(data) < wire.HeaderLen+n {
			break
		}
		out = appendMasked(out, ws.OpBinary, data[wire.HeaderLen:wire.HeaderLen+n])
		data = data[wire.HeaderLen+n:]
	}
	c.pending = append(c.pending[:0], data...)
	c.wbuf = out
	if len(out) == 0 {
		return len(b), nil
	}
	if _, err := c.Conn.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}

// appendMasked appends a final client frame of op carrying p, masked with
// a fresh key.
func appendMasked(dst []byte, op ws.OpCode, p []byte) []byte {
	var mask [4]byte
	_, _ = rand.Read(mask[:])
	dst = append(dst, 0x80|byte(op))
	switch n := len(p); {
	case n < 126:
		dst = append(dst, 0x80|byte(n))
	case n <= 0xffff:
		dst = binary.BigEndian.AppendUint16(append(dst, 0x80|126), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint64(append(dst, 0x80|127), uint64(n))
	}
	dst = append(dst, mask[:]...)
	start := len(dst)
	dst = append(dst, p...)
	ws.Cipher(dst[start:], mask, 0)
	return dst
}

// Read returns the received messages as length-prefixed frames.
func (c *wsStream) Read(p []byte) (int, error) {
	for len(c.in) == 0 {
		if c.eof != nil {
			return 0, c.eof
		}
		if err := c.readMessage(); err != nil {
			c.eof = err
		}
	}
	n := copy(p, c.in)
	c.in = c.in[n:]
	return n, nil
}

// readMessage reads frames until one data message is complete (into
// c.in, with its length prefix), answering control frames on the way.
func (c *wsStream) readMessage() error {
	for {
		h, err := ws.ReadHeader(c.br)
		if err != nil {
			return err
		}
		if err := ws.CheckHeader(h, ws.StateClientSide); err != nil {
			return err
		}
		if h.Length > 1<<30 {
			return errors.New("websocket: message too large")
		}
		payload := make([]byte, h.Length)
		if _, err := io.ReadFull(c.br, payload); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		switch h.OpCode {
		case ws.OpPing:
			c.control(ws.OpPong, payload)
			continue
		case ws.OpPong:
			continue
		case ws.OpClose:
			c.control(ws.OpClose, payload[:min(len(payload), 2)])
			return io.EOF
		case ws.OpText:
			return errors.New("websocket: the server sent a text message")
		}
		c.frag = append(c.frag, payload...)
		if !h.Fin {
			continue
		}
		c.in = binary.BigEndian.AppendUint32(make([]byte, 0, wire.HeaderLen+len(c.frag)), uint32(len(c.frag)))
		c.in = append(c.in, c.frag...)
		c.frag = c.frag[:0]
		return nil
	}
}

// control sends a control frame (a pong, or the close reply).
func (c *wsStream) control(op ws.OpCode, p []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wbufR = appendMasked(c.wbufR[:0], op, p)
	_, _ = c.Conn.Write(c.wbufR)
}
