package conn_test

// The WebSocket transport (docs/protocol.md, "WebSocket") against a real
// in-process server: the handshake, one frame per binary message,
// fragments, control frames, close codes, and every kind of bad input,
// each answered with its error or close, counted, and leaving no
// connection behind.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
	"github.com/parley-im/parley/wire"
)

// wsRaw is a WebSocket client that sends arbitrary frames and collects
// what the server sends: messages (decoded) and the close code.
type wsRaw struct {
	t      *testing.T
	nc     net.Conn
	br     *bufio.Reader
	frames chan wire.Message
	pongs  chan []byte
	done   chan struct{}
	close  atomic.Int32 // the server's close code (0: none)
	err    error
}

// wsRequest is an upgrade request for path with extra header lines.
func wsRequest(path string, extra ...string) string {
	h := "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
	for _, e := range extra {
		h += e + "\r\n"
	}
	return h + "\r\n"
}

// wsHandshake sends req on a fresh connection and returns the response.
func wsHandshake(t *testing.T, env *parleytest.Env, req string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", env.WSAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if _, err := io.WriteString(nc, req); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("handshake response: %v", err)
	}
	_ = nc.SetReadDeadline(time.Time{})
	return nc, br, resp
}

// dialWS upgrades a connection, offering parley.msgpack.
func dialWS(t *testing.T, env *parleytest.Env) *wsRaw {
	t.Helper()
	nc, br, resp := wsHandshake(t, env, wsRequest("/v1/ws", "Sec-WebSocket-Protocol: other, parley.msgpack"))
	if resp.StatusCode != 101 || resp.Header.Get("Sec-WebSocket-Protocol") != "parley.msgpack" ||
		resp.Header.Get("Sec-WebSocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Fatalf("handshake: %d %v", resp.StatusCode, resp.Header)
	}
	w := &wsRaw{t: t, nc: nc, br: br, frames: make(chan wire.Message, 1024), pongs: make(chan []byte, 16), done: make(chan struct{})}
	go w.readLoop()
	return w
}

func (w *wsRaw) readLoop() {
	defer close(w.done)
	for {
		f, err := ws.ReadFrame(w.br)
		if err != nil {
			w.err = err
			return
		}
		if f.Header.Masked {
			w.err = fmt.Errorf("the server sent a masked frame")
			return
		}
		switch f.Header.OpCode {
		case ws.OpBinary:
			if !f.Header.Fin {
				w.err = fmt.Errorf("the server fragmented a message")
				return
			}
			m, err := wire.DecodeMessage(f.Payload)
			if err != nil {
				w.err = err
				return
			}
			w.frames <- m
		case ws.OpPong:
			w.pongs <- f.Payload
		case ws.OpClose:
			code, _ := ws.ParseCloseFrameData(f.Payload)
			w.close.Store(int32(code))
			// The server closes the TCP connection after its close frame.
			_, w.err = io.Copy(io.Discard, w.br)
			return
		default:
			w.err = fmt.Errorf("unexpected opcode %v", f.Header.OpCode)
			return
		}
	}
}

// frame writes one client frame (masked unless mask is false).
func (w *wsRaw) frame(op ws.OpCode, fin, mask bool, payload []byte) {
	w.t.Helper()
	w.write(wsFrameBytes(op, fin, mask, payload))
}

func wsFrameBytes(op ws.OpCode, fin, mask bool, payload []byte) []byte {
	f := ws.NewFrame(op, fin, append([]byte(nil), payload...))
	if mask {
		f = ws.MaskFrameWith(f, [4]byte{0x11, 0x22, 0x33, 0x44})
	}
	b, err := ws.CompileFrame(f)
	if err != nil {
		panic(err)
	}
	return b
}

func (w *wsRaw) write(b []byte) {
	w.t.Helper()
	_ = w.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := w.nc.Write(b); err != nil {
		w.t.Fatalf("write: %v", err)
	}
}

// send writes v as one binary message.
func (w *wsRaw) send(v any) {
	w.t.Helper()
	w.frame(ws.OpBinary, true, true, mustFrame(w.t, v)[wire.HeaderLen:])
}

// expect returns the next message (pushes skipped), which must be typ.
func (w *wsRaw) expect(typ string) wire.Message {
	w.t.Helper()
	timer := time.NewTimer(5 * time.Second)
	defer timer.Stop()
	for {
		select {
		case m := <-w.frames:
			if m.T == wire.TPush && typ != wire.TPush {
				continue
			}
			if m.T != typ {
				w.t.Fatalf("want %s, got %+v", typ, m)
			}
			return m
		case <-w.done:
			select {
			case m := <-w.frames:
				if m.T == typ {
					return m
				}
				w.t.Fatalf("want %s, got %+v", typ, m)
			default:
			}
			w.t.Fatalf("want %s, the connection ended (close %d, %v)", typ, w.close.Load(), w.err)
		case <-timer.C:
			w.t.Fatalf("no %s within 5s", typ)
		}
	}
}

func (w *wsRaw) expectError(code wire.Code) {
	w.t.Helper()
	if m := w.expect(wire.TError); m.Code != code || m.Msg == "" {
		w.t.Fatalf("want error %s, got %+v", code, m)
	}
}

// expectClose waits for the server's close frame with code and the end
// of the connection, with no message before them.
func (w *wsRaw) expectClose(code ws.StatusCode) {
	w.t.Helper()
	select {
	case <-w.done:
	case <-time.After(5 * time.Second):
		w.t.Fatalf("the server did not close within 5s")
	}
	select {
	case m := <-w.frames:
		w.t.Fatalf("want close %d, got %+v", code, m)
	default:
	}
	if got := ws.StatusCode(w.close.Load()); got != code {
		w.t.Fatalf("close code %d, want %d (%v)", got, code, w.err)
	}
}

func (w *wsRaw) auth(dev parleytest.Device) {
	w.t.Helper()
	w.send(wire.Request{T: wire.TAuth, Rid: "auth", Device: dev.ID, Token: dev.Token})
	if m := w.expect(wire.TAuthOK); m.Device != dev.ID {
		w.t.Fatalf("auth_ok = %+v", m)
	}
}

func (w *wsRaw) ping() {
	w.t.Helper()
	w.send(wire.Request{T: wire.TPing, Rid: "p"})
	w.expect(wire.TPong)
}

func authedWS(t *testing.T, env *parleytest.Env) (*wsRaw, parleytest.Device) {
	t.Helper()
	dev := newUser(t, env, "w")
	w := dialWS(t, env)
	w.auth(dev)
	return w, dev
}

func wsMetric(env *parleytest.Env, name, label, value string) float64 {
	return env.Srv.MetricWith(name, label, value)
}

// checkCounted waits until the counter name{label=value} exceeds before.
func checkCounted(t *testing.T, env *parleytest.Env, name, label, value string, before float64) {
	t.Helper()
	testenv.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if got := wsMetric(env, name, label, value); got <= before {
			return fmt.Errorf("%s{%s=%q} = %v, not counted", name, label, value, got)
		}
		return nil
	})
}

func startWS(t *testing.T, mod func(*config.Config)) *parleytest.Env {
	return startEnv(t, func(c *config.Config) {
		c.WSListen = "auto"
		c.WSOrigins = "https://app.example.com, http://127.0.0.1:8080"
		c.AuthTimeout = 2 * time.Second
		if mod != nil {
			mod(c)
		}
	})
}

func TestWebSocketHandshake(t *testing.T) {
	env := startWS(t, nil)
	const hs = "parley_gateway_ws_handshakes_total"

	t.Run("Accepted", func(t *testing.T) {
		for _, extra := range [][]string{
			nil, // no subprotocol offered, no Origin (not a browser)
			{"Origin: https://app.example.com"},
			{"Origin: HTTP://127.0.0.1:8080", "Sec-WebSocket-Protocol: parley.msgpack"},
		} {
			_, _, resp := wsHandshake(t, env, wsRequest("/v1/ws?v=1", extra...))
			if resp.StatusCode != 101 {
				t.Fatalf("%v: status %d", extra, resp.StatusCode)
			}
			if p := resp.Header.Get("Sec-WebSocket-Protocol"); (p != "") != strings.Contains(strings.Join(extra, " "), "parley.msgpack") {
				t.Fatalf("%v: subprotocol %q", extra, p)
			}
		}
	})

	for _, c := range []struct {
		name   string
		req    string
		status int
		result string
	}{
		{"BadKey", strings.Replace(wsRequest("/v1/ws"), "dGhlIHNhbXBsZSBub25jZQ==", "short", 1), 400, "bad_request"},
		{"NoKey", strings.Replace(wsRequest("/v1/ws"), "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", "", 1), 400, "bad_request"},
		{"WrongVersion", strings.Replace(wsRequest("/v1/ws"), "Version: 13", "Version: 8", 1), 426, "bad_request"},
		{"NotUpgrade", strings.Replace(wsRequest("/v1/ws"), "Upgrade: websocket\r\n", "", 1), 400, "bad_request"},
		{"Post", strings.Replace(wsRequest("/v1/ws"), "GET", "POST", 1), 405, "bad_request"},
		{"WrongPath", wsRequest("/ws"), 404, "path"},
		{"ForeignOrigin", wsRequest("/v1/ws", "Origin: https://evil.example"), 403, "origin"},
		{"HeadersTooLarge", wsRequest("/v1/ws", "X-Pad: "+strings.Repeat("a", 9000)), 431, "too_large"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := wsMetric(env, hs, "result", c.result)
			nc, br, resp := wsHandshake(t, env, c.req)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
			}
			_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			// Closed: EOF, or a reset when the server closed with some of
			// the oversized request unread.
			if _, err := io.Copy(io.Discard, br); err != nil && !strings.Contains(err.Error(), "reset") {
				t.Fatalf("the connection was not closed: %v", err)
			}
			checkCounted(t, env, hs, "result", c.result, before)
		})
	}

	t.Run("OneByteAtATime", func(t *testing.T) {
		nc, err := net.Dial("tcp", env.WSAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		dev := newUser(t, env, "w")
		stream := []byte(wsRequest("/v1/ws"))
		stream = append(stream, wsFrameBytes(ws.OpBinary, true, true, mustFrame(t, wire.Request{T: wire.TAuth, Rid: "a", Device: dev.ID, Token: dev.Token})[wire.HeaderLen:])...)
		for i := range stream {
			if _, err := nc.Write(stream[i : i+1]); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Microsecond)
		}
		_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(nc)
		if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
			t.Fatalf("handshake: %v", err)
		}
		f, err := ws.ReadFrame(br)
		if err != nil {
			t.Fatal(err)
		}
		if m, _ := wire.DecodeMessage(f.Payload); m.T != wire.TAuthOK {
			t.Fatalf("got %+v", m)
		}
	})

	// A handshake cut short, or never finished: closed, counted, no leak.
	t.Run("Truncated", func(t *testing.T) {
		before := wsMetric(env, hs, "result", "truncated")
		nc, err := net.Dial("tcp", env.WSAddr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(nc, "GET /v1/ws HTTP/1.1\r\nHost: x\r\n")
		time.Sleep(50 * time.Millisecond)
		nc.Close()
		checkCounted(t, env, hs, "result", "truncated", before)
	})
	t.Run("NeverFinished", func(t *testing.T) {
		nc, err := net.Dial("tcp", env.WSAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		io.WriteString(nc, "GET /v1/ws HTTP/1.1\r\n")
		expectClosedSilently(t, nc) // by auth_timeout (2 s), without a byte
	})
	testenv.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if n := env.Srv.MetricSum("parley_gateway_connections"); n != 0 {
			return fmt.Errorf("%v connections still open", n)
		}
		return nil
	})
}

func TestWebSocketMessages(t *testing.T) {
	env := startWS(t, nil)
	maxFrame := env.Cfg.MaxFrame
	const werrs = "parley_gateway_ws_errors_total"

	t.Run("SendAndPush", func(t *testing.T) {
		t.Parallel()
		a, da := authedWS(t, env)
		b, db := authedWS(t, env)
		conv := name("c-ws")
		env.Group(t, conv, da.User, db.User)
		a.send(wire.Request{T: wire.TSend, Rid: "s", Conv: conv, Cmid: "m1", Body: []byte("over websocket")})
		if m := a.expect(wire.TSendOK); m.Seq != 2 {
			t.Fatalf("send_ok = %+v", m)
		}
		for {
			m := b.expect(wire.TPush)
			if m.Seq == 2 {
				if string(m.Body) != "over websocket" {
					t.Fatalf("push = %+v", m)
				}
				break
			}
		}
	})

	// A fragmented message, with a ping between its fragments, is
	// reassembled; the ping is answered at once.
	t.Run("Fragmented", func(t *testing.T) {
		t.Parallel()
		dev := newUser(t, env, "w")
		w := dialWS(t, env)
		body := mustFrame(t, wire.Request{T: wire.TAuth, Rid: "a", Device: dev.ID, Token: dev.Token})[wire.HeaderLen:]
		w.frame(ws.OpBinary, false, true, body[:5])
		w.frame(ws.OpPing, true, true, []byte("hello"))
		w.frame(ws.OpContinuation, false, true, body[5:9])
		w.frame(ws.OpContinuation, false, true, nil)
		w.frame(ws.OpContinuation, true, true, body[9:])
		select {
		case p := <-w.pongs:
			if string(p) != "hello" {
				t.Fatalf("pong %q", p)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no pong")
		}
		w.expect(wire.TAuthOK)
		w.ping()
	})

	t.Run("ExactlyMaxFrame", func(t *testing.T) {
		t.Parallel()
		w, _ := authedWS(t, env)
		head := mpMap("t", "ping", "rid", "big", "pad", raw{0xc5, 0, 0})
		pad := maxFrame - len(head)
		body := append([]byte(nil), head...)
		body[len(body)-2], body[len(body)-1] = byte(pad>>8), byte(pad)
		body = append(body, make([]byte, pad)...)
		// In two fragments, as much as max_frame in all.
		w.frame(ws.OpBinary, false, true, body[:100])
		w.frame(ws.OpContinuation, true, true, body[100:])
		if m := w.expect(wire.TPong); m.Rid != "big" {
			t.Fatalf("pong = %+v", m)
		}
	})

	t.Run("TextMessage", func(t *testing.T) {
		t.Parallel()
		before := wsMetric(env, werrs, "reason", "text")
		w, _ := authedWS(t, env)
		w.frame(ws.OpText, true, true, []byte(`{"t":"ping"}`))
		w.expectError(wire.BadFrame)
		w.ping() // still open
		checkCounted(t, env, werrs, "reason", "text", before)
		// As the first message: UNAUTHENTICATED and close (policy).
		w2 := dialWS(t, env)
		w2.frame(ws.OpText, true, true, []byte("hi"))
		w2.expectError(wire.Unauthenticated)
		w2.expectClose(ws.StatusPolicyViolation)
	})

	t.Run("UndecodableBinary", func(t *testing.T) {
		t.Parallel()
		w, _ := authedWS(t, env)
		w.frame(ws.OpBinary, true, true, []byte{0xc1})
		w.expectError(wire.BadFrame)
		w.frame(ws.OpBinary, true, true, nil)
		w.expectError(wire.BadFrame)
		w.ping()
		// As the first message, an empty one is a body that does not
		// decode, like any other (there is no length prefix to be 0):
		// UNAUTHENTICATED and close (docs/protocol.md §2).
		w2 := dialWS(t, env)
		w2.frame(ws.OpBinary, true, true, nil)
		w2.expectError(wire.Unauthenticated)
		w2.expectClose(ws.StatusPolicyViolation)
	})

	for _, c := range []struct {
		name   string
		reason string
		frames func(w *wsRaw)
	}{
		{"Oversized", "too_large", func(w *wsRaw) {
			// Only the header: the refusal must not wait for the payload.
			w.write(wsFrameBytes(ws.OpBinary, true, true, make([]byte, maxFrame+1))[:8])
		}},
		{"OversizedFragments", "too_large", func(w *wsRaw) {
			w.frame(ws.OpBinary, false, true, make([]byte, maxFrame-10))
			w.frame(ws.OpContinuation, false, true, make([]byte, 11))
		}},
		{"NeverEndingFragments", "fragments", func(w *wsRaw) {
			var b []byte
			b = append(b, wsFrameBytes(ws.OpBinary, false, true, []byte{0x81})...)
			for range 1100 {
				b = append(b, wsFrameBytes(ws.OpContinuation, false, true, nil)...)
			}
			w.write(b)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			before := wsMetric(env, werrs, "reason", c.reason)
			w, _ := authedWS(t, env)
			c.frames(w)
			w.expectError(wire.TooLarge)
			w.expectClose(ws.StatusMessageTooBig)
			checkCounted(t, env, werrs, "reason", c.reason, before)
		})
	}

	for _, c := range []struct {
		name   string
		reason string
		frame  []byte
	}{
		{"Unmasked", "unmasked", wsFrameBytes(ws.OpBinary, true, false, mpMap("t", "ping"))},
		{"ReservedOpcode", "protocol", wsFrameBytes(3, true, true, nil)},
		{"ReservedBits", "protocol", func() []byte { b := wsFrameBytes(ws.OpBinary, true, true, mpMap("t", "ping")); b[0] |= 0x40; return b }()},
		{"LoneContinuation", "protocol", wsFrameBytes(ws.OpContinuation, true, true, nil)},
		{"FragmentedPing", "protocol", wsFrameBytes(ws.OpPing, false, true, nil)},
		{"LongPing", "protocol", wsFrameBytes(ws.OpPing, true, true, make([]byte, 126))},
		{"BadCloseCode", "protocol", wsFrameBytes(ws.OpClose, true, true, []byte{0, 1})},
		{"NewMessageInsideFragmented", "protocol", append(wsFrameBytes(ws.OpBinary, false, true, []byte{1}), wsFrameBytes(ws.OpBinary, true, true, []byte{1})...)},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			before := wsMetric(env, werrs, "reason", c.reason)
			w, _ := authedWS(t, env)
			w.write(c.frame)
			w.expectClose(ws.StatusProtocolError)
			checkCounted(t, env, werrs, "reason", c.reason, before)
		})
	}

	// A protocol error right behind a request: the reply (whose write may
	// still be in flight) goes out, then the close frame.
	t.Run("ProtocolErrorBehindAReply", func(t *testing.T) {
		t.Parallel()
		w, _ := authedWS(t, env)
		ping := wsFrameBytes(ws.OpBinary, true, true, mustFrame(t, wire.Request{T: wire.TPing, Rid: "p"})[wire.HeaderLen:])
		w.write(append(ping, wsFrameBytes(ws.OpBinary, true, false, nil)...))
		w.expect(wire.TPong)
		w.expectClose(ws.StatusProtocolError)
	})

	t.Run("ClientClose", func(t *testing.T) {
		t.Parallel()
		w, _ := authedWS(t, env)
		w.frame(ws.OpClose, true, true, ws.NewCloseFrameBody(ws.StatusGoingAway, "bye"))
		w.expectClose(ws.StatusGoingAway)
		w2, _ := authedWS(t, env)
		w2.frame(ws.OpClose, true, true, nil)
		w2.expectClose(ws.StatusNormalClosure)
	})

	t.Run("AuthTimeout", func(t *testing.T) {
		t.Parallel()
		w := dialWS(t, env)
		w.expectError(wire.Unauthenticated)
		w.expectClose(ws.StatusPolicyViolation)
	})

	t.Run("BadToken", func(t *testing.T) {
		t.Parallel()
		dev := newUser(t, env, "w")
		w := dialWS(t, env)
		w.send(wire.Request{T: wire.TAuth, Rid: "a", Device: dev.ID, Token: "wrong"})
		w.expectError(wire.AuthFailed)
		w.expectClose(ws.StatusPolicyViolation)
	})

	// A device's WebSocket and TCP connections replace each other.
	t.Run("Replacement", func(t *testing.T) {
		t.Parallel()
		dev := newUser(t, env, "w")
		w := dialWS(t, env)
		w.auth(dev)
		r := dialRaw(t, env)
		r.auth(dev)
		if m := w.expect(wire.TKick); m.Reason != "replaced" {
			t.Fatalf("kick = %+v", m)
		}
		w.expectClose(ws.StatusNormalClosure)
		w2 := dialWS(t, env)
		w2.auth(dev)
		if m := r.expect(wire.TKick); m.Reason != "replaced" {
			t.Fatalf("kick = %+v", m)
		}
		r.expectClosed(3 * time.Second)
		w2.ping()
	})

	t.Run("GoClient", func(t *testing.T) {
		t.Parallel()
		a, b := newUser(t, env, "wa"), newUser(t, env, "wb")
		conv := name("c-wsgo")
		env.Group(t, conv, a.User, b.User)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pushes := make(chan wire.Message, 16)
		url := "ws://" + env.WSAddr + "/v1/ws"
		ca, err := client.Dial(ctx, url, a.ID, a.Token, client.DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer ca.Close()
		cb, err := client.Dial(ctx, url, b.ID, b.Token, client.DialOptions{OnServerFrame: func(m wire.Message) {
			if m.T == wire.TPush && m.Seq > 1 {
				pushes <- m
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		defer cb.Close()
		big := bytes.Repeat([]byte("x"), env.Cfg.MaxBody)
		if _, err := ca.Send(ctx, conv, "m1", big); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-pushes:
			if !bytes.Equal(m.Body, big) {
				t.Fatalf("push body of %d bytes", len(m.Body))
			}
		case <-ctx.Done():
			t.Fatal("no push")
		}
		s, err := cb.Sync(ctx, conv, 0, 0)
		if err != nil || s.Head != 2 {
			t.Fatalf("sync = %+v, %v", s, err)
		}
	})
}

// After all of it, every connection is gone and the server serves TCP
// and WebSocket clients alike; at shutdown a WebSocket client gets kick
// "shutdown" and close 1001.
func TestWebSocketNoLeaksAndShutdown(t *testing.T) {
	env := startWS(t, nil)
	var open []*wsRaw
	for range 5 {
		w, _ := authedWS(t, env)
		open = append(open, w)
	}
	w := dialWS(t, env)
	w.write(wsFrameBytes(ws.OpBinary, true, false, nil)) // unmasked
	w.expectClose(ws.StatusProtocolError)
	for _, w := range open {
		w.frame(ws.OpClose, true, true, nil)
		w.expectClose(ws.StatusNormalClosure)
	}
	testenv.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if n := env.Srv.MetricSum("parley_gateway_connections"); n != 0 {
			return fmt.Errorf("%v connections still open", n)
		}
		return nil
	})
	assertServerHealthy(t, env)

	last, _ := authedWS(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shutdown := make(chan error, 1)
	go func() { shutdown <- env.Srv.Shutdown(ctx) }()
	if m := last.expect(wire.TKick); m.Reason != "shutdown" {
		t.Fatalf("kick = %+v", m)
	}
	last.expectClose(ws.StatusGoingAway)
	// The shutdown completes within its ctx (the deferred cancel must not
	// cut it short).
	select {
	case err := <-shutdown:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Shutdown did not return within 15s")
	}
}
