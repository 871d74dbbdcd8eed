package conn_test

// Bad input and the framing of docs/protocol.md §1, against a real
// in-process server on real PostgreSQL and Redis: bad input gets a clear
// error or a closed connection, never a crash, a hang, or another user's
// data. After every bad-input case a second, well-behaved client must
// still auth, send, receive a push and sync (assertServerHealthy).
//
// The session rules of docs/protocol.md §2 are in session_test.go.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
	"github.com/parley-im/parley/wire"
)

// ---- test server ----

// startEnv starts a server with the test defaults (small limits, so that
// they are cheap to hit), changed by mod.
func startEnv(t *testing.T, mod func(*config.Config)) *parleytest.Env {
	t.Helper()
	cfg := parleytest.Config(t)
	cfg.MaxFrame = 1024
	cfg.MaxBody = 100
	cfg.AuthTimeout = 5 * time.Second
	cfg.IdleTimeout = 30 * time.Second
	if mod != nil {
		mod(&cfg)
	}
	return parleytest.Start(t, cfg)
}

var uniq atomic.Int64

// name returns a user or conversation id unique in this test binary.
func name(prefix string) string { return fmt.Sprintf("%s%d", prefix, uniq.Add(1)) }

// newUser provisions a user with one device.
func newUser(t *testing.T, env *parleytest.Env, prefix string) parleytest.Device {
	t.Helper()
	return env.User(t, name(prefix), 1)[0]
}

// assertServerHealthy checks, with fresh users and a fresh group, that a
// well-behaved client can still auth, send, get a push to another member,
// sync what was sent and ping: whatever the test did before did not break
// the server for anyone else.
func assertServerHealthy(t *testing.T, env *parleytest.Env) {
	t.Helper()
	start := time.Now()
	a, b := newUser(t, env, "ha"), newUser(t, env, "hb")
	conv := name("c-healthy")
	env.Group(t, conv, a.User, b.User)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pushes := make(chan wire.Message, 16)
	ca, err := client.Dial(ctx, env.Addr, a.ID, a.Token, client.DialOptions{})
	if err != nil {
		t.Fatalf("healthy: dial %s: %v", a.ID, err)
	}
	defer ca.Close()
	cb, err := client.Dial(ctx, env.Addr, b.ID, b.Token, client.DialOptions{OnServerFrame: func(m wire.Message) {
		select {
		case pushes <- m:
		default:
		}
	}})
	if err != nil {
		t.Fatalf("healthy: dial %s: %v", b.ID, err)
	}
	defer cb.Close()
	ok, err := ca.Send(ctx, conv, "m1", []byte("still fine"))
	if err != nil || ok.Seq != 2 {
		t.Fatalf("healthy: send = %+v, %v (want seq 2)", ok, err)
	}
	for got := false; !got; {
		select {
		case p := <-pushes:
			if p.T == wire.TPush && p.Seq == 1 {
				continue // the join, when fan-out was slower than the dial
			}
			if p.T != wire.TPush || p.Conv != conv || p.Seq != 2 || string(p.Body) != "still fine" {
				t.Fatalf("healthy: push = %+v", p)
			}
			got = true
		case <-ctx.Done():
			t.Fatalf("healthy: no push")
		}
	}
	s, err := cb.Sync(ctx, conv, 0, 0)
	if err != nil || s.Head != 2 || len(s.Events) != 2 || string(s.Events[1].Body) != "still fine" {
		t.Fatalf("healthy: sync = %+v, %v", s, err)
	}
	if err := ca.Ping(ctx); err != nil {
		t.Fatalf("healthy: ping: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("healthy: took %v", d)
	}
}

// ---- raw connections ----

// rawConn is a client connection that sends arbitrary bytes and collects
// every frame the server sends, in order, on a reader goroutine (so waiting
// for a frame is a select with a timeout and nothing can hang).
type rawConn struct {
	t *testing.T
	// strict: next returns pushes too. Otherwise they are skipped: a
	// conversation created for a test pushes its join event to members
	// already online (fan-out is asynchronous, so also to one that
	// connected just after the create).
	strict bool
	nc     net.Conn
	frames chan wire.Message
	stop   chan struct{}
	done   chan struct{} // closed when the server ended the stream
	err    error         // why; valid after done
	rid    atomic.Int64
}

func dialRaw(t *testing.T, env *parleytest.Env) *rawConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", env.Addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r := &rawConn{t: t, nc: nc, frames: make(chan wire.Message, 1<<15), stop: make(chan struct{}), done: make(chan struct{})}
	go r.readLoop()
	t.Cleanup(func() {
		close(r.stop)
		nc.Close()
		<-r.done
	})
	return r
}

func (r *rawConn) readLoop() {
	defer close(r.done)
	fr := wire.NewFrameReader(r.nc, 16<<20)
	for {
		body, err := fr.Next()
		if err != nil {
			r.err = err
			return
		}
		m, err := wire.DecodeMessage(body)
		if err != nil {
			r.err = fmt.Errorf("server sent an undecodable frame: %w", err)
			return
		}
		select {
		case r.frames <- m:
		case <-r.stop:
			r.err = errors.New("test ended")
			return
		}
	}
}

func (r *rawConn) write(b []byte) {
	r.t.Helper()
	_ = r.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.nc.Write(b); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

// send writes v (a wire type, or any msgpack-encodable value) as a frame.
func (r *rawConn) send(v any) {
	r.t.Helper()
	r.write(mustFrame(r.t, v))
}

// next returns the next frame (pushes skipped unless strict), or closed =
// true when the server ended the stream; it fails the test after timeout.
func (r *rawConn) next(timeout time.Duration) (m wire.Message, closed bool) {
	r.t.Helper()
	return r.nextFrame(timeout, r.strict)
}

func (r *rawConn) nextFrame(timeout time.Duration, pushes bool) (m wire.Message, closed bool) {
	r.t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case m = <-r.frames:
		case <-r.done:
			select {
			case m = <-r.frames:
			default:
				return wire.Message{}, true
			}
		case <-timer.C:
			r.t.Fatalf("no frame from the server within %v", timeout)
			return wire.Message{}, false
		}
		if pushes || m.T != wire.TPush {
			return m, false
		}
	}
}

// expect returns the next frame, which must be of type typ.
func (r *rawConn) expect(typ string) wire.Message {
	r.t.Helper()
	m, closed := r.nextFrame(5*time.Second, r.strict || typ == wire.TPush)
	if closed {
		r.t.Fatalf("want %s, the connection was closed (%v)", typ, r.err)
	}
	if m.T != typ {
		r.t.Fatalf("want %s, got %+v", typ, m)
	}
	return m
}

// expectError returns the next frame, which must be an error with code and
// rid.
func (r *rawConn) expectError(code wire.Code, rid string) wire.Message {
	r.t.Helper()
	m := r.expect(wire.TError)
	if m.Code != code || m.Rid != rid {
		r.t.Fatalf("want error %s rid %q, got %+v", code, rid, m)
	}
	if m.Msg == "" {
		r.t.Fatalf("error %s without msg", code)
	}
	return m
}

// expectClosed waits for the server to close the connection, failing on
// any frame that arrives first.
func (r *rawConn) expectClosed(within time.Duration) {
	r.t.Helper()
	m, closed := r.next(within)
	if !closed {
		r.t.Fatalf("want the connection closed, got %+v", m)
	}
	if errors.Is(r.err, io.ErrUnexpectedEOF) || strings.Contains(fmt.Sprint(r.err), "undecodable") {
		r.t.Fatalf("the stream ended inside a frame: %v", r.err)
	}
}

// ping sends a ping with a fresh rid and requires the next frame to be its
// pong: the connection is open and in order.
func (r *rawConn) ping() {
	r.t.Helper()
	rid := fmt.Sprintf("ping-%d", r.rid.Add(1))
	r.send(wire.Request{T: wire.TPing, Rid: rid})
	if m := r.expect(wire.TPong); m.Rid != rid || m.Ts == 0 {
		r.t.Fatalf("pong = %+v, want rid %s and ts", m, rid)
	}
}

// auth authenticates as dev.
func (r *rawConn) auth(dev parleytest.Device) wire.Message {
	r.t.Helper()
	r.send(wire.Request{T: wire.TAuth, Rid: "auth", Device: dev.ID, Token: dev.Token})
	m := r.expect(wire.TAuthOK)
	if m.Rid != "auth" || m.User != dev.User || m.Device != dev.ID || m.Ts == 0 {
		r.t.Fatalf("auth_ok = %+v", m)
	}
	return m
}

// authedRaw dials and authenticates a new user's device.
func authedRaw(t *testing.T, env *parleytest.Env) (*rawConn, parleytest.Device) {
	t.Helper()
	dev := newUser(t, env, "u")
	r := dialRaw(t, env)
	r.auth(dev)
	return r, dev
}

// ---- frames and msgpack by hand ----

// withBody frames body: its 4-byte length, then body.
func withBody(body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

func mustFrame(t *testing.T, v any) []byte {
	t.Helper()
	b, err := wire.AppendFrame(nil, v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// raw is msgpack that mp writes as it is.
type raw []byte

// mp encodes v: raw as is, everything else with vmihailenco/msgpack.
func mp(v any) []byte {
	if r, ok := v.(raw); ok {
		return r
	}
	b, err := msgpack.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// mpMap encodes a map from alternating keys and values, in that order.
func mpMap(kv ...any) raw {
	n := len(kv) / 2
	var b []byte
	if n < 16 {
		b = []byte{0x80 | byte(n)}
	} else {
		b = []byte{0xde, byte(n >> 8), byte(n)}
	}
	for _, v := range kv {
		b = append(b, mp(v)...)
	}
	return b
}

// ---- framing ----

func TestFraming(t *testing.T) {
	env := startEnv(t, nil)
	maxFrame := env.Cfg.MaxFrame

	// N = 0 breaks the framing: BAD_FRAME, then the connection is closed,
	// before and after auth alike (as the first frame it is not
	// UNAUTHENTICATED: docs/protocol.md §1, §2).
	t.Run("ZeroLength", func(t *testing.T) {
		t.Parallel()
		for _, authed := range []bool{false, true} {
			r := dialRaw(t, env)
			if authed {
				r.auth(newUser(t, env, "u"))
			}
			r.write([]byte{0, 0, 0, 0})
			r.expectError(wire.BadFrame, "")
			r.expectClosed(3 * time.Second)
		}
		assertServerHealthy(t, env)
	})

	// N > max_frame: TOO_LARGE from the 4 header bytes alone. Only the
	// header is ever sent, so a server that waited for the body would time
	// the test out.
	t.Run("TooLargeFromHeaderAlone", func(t *testing.T) {
		t.Parallel()
		for _, n := range []uint32{uint32(maxFrame) + 1, 1 << 31, 0xffffffff} {
			for _, authed := range []bool{false, true} {
				r := dialRaw(t, env)
				if authed {
					r.auth(newUser(t, env, "u"))
				}
				r.write(binary.BigEndian.AppendUint32(nil, n))
				r.expectError(wire.TooLarge, "")
				r.expectClosed(3 * time.Second)
			}
		}
		assertServerHealthy(t, env)
	})

	// A frame of exactly max_frame bytes is accepted (unknown keys are
	// ignored, so a padded ping is a ping).
	t.Run("ExactlyMaxFrame", func(t *testing.T) {
		t.Parallel()
		r, _ := authedRaw(t, env)
		head := mpMap("t", "ping", "rid", "big", "pad", raw{0xc5, 0, 0})
		pad := maxFrame - len(head)
		body := append([]byte(nil), head...)
		body[len(body)-2], body[len(body)-1] = byte(pad>>8), byte(pad)
		body = append(body, make([]byte, pad)...)
		if len(body) != maxFrame {
			t.Fatalf("built %d bytes", len(body))
		}
		r.write(withBody(body))
		if m := r.expect(wire.TPong); m.Rid != "big" {
			t.Fatalf("pong = %+v", m)
		}
		r.ping()
	})

	// Frames that arrive one byte per write (header included) are
	// reassembled: auth, then a ping.
	t.Run("OneByteWrites", func(t *testing.T) {
		t.Parallel()
		dev := newUser(t, env, "u")
		r := dialRaw(t, env)
		stream := mustFrame(t, wire.Request{T: wire.TAuth, Rid: "a1", Device: dev.ID, Token: dev.Token})
		stream = append(stream, mustFrame(t, wire.Request{T: wire.TPing, Rid: "p1"})...)
		for i := range stream {
			r.write(stream[i : i+1])
			time.Sleep(time.Millisecond) // pace the writes so they arrive apart
		}
		if m := r.expect(wire.TAuthOK); m.Rid != "a1" || m.Device != dev.ID {
			t.Fatalf("auth_ok = %+v", m)
		}
		if m := r.expect(wire.TPong); m.Rid != "p1" {
			t.Fatalf("pong = %+v", m)
		}
		assertServerHealthy(t, env)
	})

	// Many frames in one write are all answered, in order.
	t.Run("ManyFramesOneWrite", func(t *testing.T) {
		t.Parallel()
		r, _ := authedRaw(t, env)
		var buf []byte
		for i := range 100 {
			buf = append(buf, mustFrame(t, wire.Request{T: wire.TPing, Rid: fmt.Sprint("p", i)})...)
		}
		r.write(buf)
		for i := range 100 {
			if m := r.expect(wire.TPong); m.Rid != fmt.Sprint("p", i) {
				t.Fatalf("pong %d = %+v", i, m)
			}
		}
		// Auth and requests pipelined behind it in one write.
		dev := newUser(t, env, "u")
		conv := name("c-pipe")
		env.Group(t, conv, dev.User)
		r2 := dialRaw(t, env)
		buf = mustFrame(t, wire.Request{T: wire.TAuth, Rid: "a", Device: dev.ID, Token: dev.Token})
		buf = append(buf, mustFrame(t, wire.Request{T: wire.TSend, Rid: "s", Conv: conv, Cmid: "m1", Body: []byte("x")})...)
		r2.write(buf)
		if m := r2.expect(wire.TAuthOK); m.Rid != "a" {
			t.Fatalf("auth_ok = %+v", m)
		}
		if m := r2.expect(wire.TSendOK); m.Rid != "s" || m.Seq != 2 {
			t.Fatalf("send_ok = %+v", m)
		}
		assertServerHealthy(t, env)
	})
}

// ---- bodies that are not requests ----

// TestBadBody: a well-framed body that is not a request with a known t is
// BAD_FRAME, a wrong or missing field is BAD_REQUEST; the error echoes the
// rid when one could be read, and the connection stays open.
func TestBadBody(t *testing.T) {
	env := startEnv(t, nil)

	// Memory first, before the parallel subtests start: claimed lengths
	// are never allocated.
	t.Run("ClaimedLengthsNotAllocated", func(t *testing.T) {
		r, _ := authedRaw(t, env)
		huge := []raw{
			{0xdf, 0xff, 0xff, 0xff, 0xff},             // map of 4 billion entries
			{0xdd, 0xff, 0xff, 0xff, 0xff},             // array of 4 billion
			{0xdb, 0xff, 0xff, 0xff, 0xff},             // str of 4 GB
			{0xc6, 0xff, 0xff, 0xff, 0xff},             // bin of 4 GB
			{0xc9, 0xff, 0xff, 0xff, 0xff, 0x01},       // ext of 4 GB
			{0xde, 0xff, 0xff},                         // map16 of 65535
			{0xdc, 0xff, 0xff},                         // array16 of 65535
			{0x91, 0xdf, 0x7f, 0xff, 0xff, 0xff, 0xc0}, // nested
		}
		var bodies [][]byte
		for _, h := range huge {
			bodies = append(bodies,
				h, // the whole body
				mpMap("t", "ping", "rid", "x", "junk", h),                            // an unknown key's value
				mpMap("t", "conv_create", "rid", "x", "kind", "group", "members", h), // a known field
				mpMap("t", "send", "rid", "x", "conv", h),
				mpMap("t", "send", "rid", "x", "body", h),
				mpMap("t", "snapshot", "rid", "x", "convs", raw(append([]byte{0x91}, h...))),
			)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		const rounds = 50
		for range rounds {
			var buf []byte
			for _, b := range bodies {
				buf = append(buf, withBody(b)...)
			}
			r.write(buf)
			// Each claims more than the frame holds: the msgpack is
			// truncated (BAD_FRAME), whatever field it is in; the rid
			// read before it is echoed.
			for i := range bodies {
				if i%6 == 0 {
					r.expectError(wire.BadFrame, "")
				} else {
					r.expectError(wire.BadFrame, "x")
				}
			}
		}
		r.ping()
		runtime.GC()
		runtime.ReadMemStats(&after)
		grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
		allocated := after.TotalAlloc - before.TotalAlloc
		t.Logf("%d hostile frames: heap grew %d KB, %d KB allocated in all", rounds*len(bodies), grew>>10, allocated>>10)
		if grew > 50<<20 || allocated > 256<<20 {
			t.Fatalf("heap grew %d bytes, %d allocated: claimed lengths were trusted", grew, allocated)
		}
		assertServerHealthy(t, env)
	})

	cases := []struct {
		name string
		body []byte
		code wire.Code
		rid  string
	}{
		// Not msgpack, or not one map.
		{"NeverUsedByte", []byte{0xc1}, wire.BadFrame, ""},
		{"Text", []byte("hello, server"), wire.BadFrame, ""},
		{"TruncatedMap", []byte{0x82, 0xa1, 't'}, wire.BadFrame, ""},
		{"TruncatedStr", []byte{0x81, 0xa1, 't', 0xa4, 'p', 'i'}, wire.BadFrame, ""},
		{"Array", mp([]string{"t", "ping"}), wire.BadFrame, ""},
		{"String", mp("ping"), wire.BadFrame, ""},
		{"Int", mp(42), wire.BadFrame, ""},
		{"Nil", mp(nil), wire.BadFrame, ""},
		{"Bin", mp([]byte("ping")), wire.BadFrame, ""},
		{"TrailingBytes", append(mpMap("t", "ping", "rid", "x"), 0x00), wire.BadFrame, "x"},
		{"TwoMaps", append(mpMap("t", "ping"), mpMap("t", "ping")...), wire.BadFrame, ""},
		{"NonStringKey", mpMap(1, "x", "t", "ping"), wire.BadFrame, ""},
		{"TooDeep", mpMap("t", "ping", "x", raw(append(bytesOf(0x91, 100), 0xc0))), wire.BadFrame, ""},
		// A map without a usable t.
		{"EmptyMap", mpMap(), wire.BadFrame, ""},
		{"NoT", mpMap("rid", "r1", "conv", "c"), wire.BadFrame, "r1"},
		{"TNil", mpMap("t", nil, "rid", "r2"), wire.BadFrame, "r2"},
		{"TInt", mpMap("t", 7, "rid", "r3"), wire.BadFrame, "r3"},
		{"TBin", mpMap("t", []byte("ping"), "rid", "r4"), wire.BadFrame, "r4"},
		{"TArray", mpMap("t", []string{"ping"}, "rid", "r5"), wire.BadFrame, "r5"},
		{"TUnknown", mpMap("t", "frobnicate", "rid", "r6"), wire.BadFrame, "r6"},
		{"TUpperCase", mpMap("t", "PING", "rid", "r7"), wire.BadFrame, "r7"},
		{"TServerType", mpMap("t", "push", "rid", "r8", "conv", "c"), wire.BadFrame, "r8"},
		{"TEmpty", mpMap("t", "", "rid", "r9"), wire.BadFrame, "r9"},
		// A field of the wrong type: BAD_REQUEST, rid echoed.
		{"SeqString", mpMap("t", "ack", "rid", "w1", "conv", "c", "seq", "5"), wire.BadRequest, "w1"},
		{"MembersMap", mpMap("t", "conv_create", "rid", "w2", "kind", "group", "members", map[string]int{"a": 1}), wire.BadRequest, "w2"},
		{"MemberInt", mpMap("t", "conv_create", "rid", "w3", "kind", "group", "members", []int{1}), wire.BadRequest, "w3"},
		{"ConvInt", mpMap("t", "sync", "rid", "w4", "conv", 12), wire.BadRequest, "w4"},
		{"AfterNegative", mpMap("t", "sync", "rid", "w5", "conv", "c", "after", -1), wire.BadRequest, "w5"},
		{"LimitFloat", mpMap("t", "sync", "rid", "w6", "conv", "c", "limit", 1.5), wire.BadRequest, "w6"},
		{"SeqAboveInt64", mpMap("t", "ack", "rid", "w7", "conv", "c", "seq", uint64(1<<63)), wire.BadRequest, "w7"},
		{"BodyInt", mpMap("t", "send", "rid", "w8", "conv", "c", "cmid", "m", "body", 5), wire.BadRequest, "w8"},
		{"MentionAllString", mpMap("t", "send", "rid", "w9", "conv", "c", "cmid", "m", "body", []byte("x"), "mention_all", "yes"), wire.BadRequest, "w9"},
		{"ConvsNotMaps", mpMap("t", "snapshot", "rid", "w10", "convs", []string{"c"}), wire.BadRequest, "w10"},
		{"KindWrong", mpMap("t", "conv_create", "rid", "w11", "kind", "channel", "members", []string{"a"}), wire.BadRequest, "w11"},
		// Missing (or empty) required fields: BAD_REQUEST, rid echoed.
		{"SendNoBody", mpMap("t", "send", "rid", "m1", "conv", "c", "cmid", "m"), wire.BadRequest, "m1"},
		{"SendNoCmid", mpMap("t", "send", "rid", "m2", "conv", "c", "body", []byte("x")), wire.BadRequest, "m2"},
		{"SendNoConv", mpMap("t", "send", "rid", "m3", "cmid", "m", "body", []byte("x")), wire.BadRequest, "m3"},
		{"SendEmptyConv", mpMap("t", "send", "rid", "m4", "conv", "", "cmid", "m", "body", []byte("x")), wire.BadRequest, "m4"},
		{"SyncNoConv", mpMap("t", "sync", "rid", "m5", "after", 0), wire.BadRequest, "m5"},
		{"AckNoSeq", mpMap("t", "ack", "rid", "m6", "conv", "c"), wire.BadRequest, "m6"},
		{"CreateNoMembers", mpMap("t", "conv_create", "rid", "m7", "kind", "group"), wire.BadRequest, "m7"},
		{"MembersAddNoUsers", mpMap("t", "members_add", "rid", "m8", "conv", "c"), wire.BadRequest, "m8"},
		{"LeaveNoConv", mpMap("t", "leave", "rid", "m9"), wire.BadRequest, "m9"},
		{"AuthNoToken", mpMap("t", "auth", "rid", "m10", "device", "d"), wire.BadRequest, "m10"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r, _ := authedRaw(t, env)
			r.write(withBody(c.body))
			r.expectError(c.code, c.rid)
			r.ping()
			// The same again in one write with a ping behind it: the
			// frame after a bad one is still read.
			r.write(append(withBody(c.body), mustFrame(t, wire.Request{T: wire.TPing, Rid: "after"})...))
			r.expectError(c.code, c.rid)
			if m := r.expect(wire.TPong); m.Rid != "after" {
				t.Fatalf("pong = %+v", m)
			}
		})
	}
	t.Run("Healthy", func(t *testing.T) {
		t.Parallel()
		assertServerHealthy(t, env)
	})
}

func bytesOf(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

// ---- limits ----

func TestLimits(t *testing.T) {
	env := startEnv(t, func(c *config.Config) {
		c.MaxFrame = 65536
		c.SendRate = 2
		c.SendBurst = 3
	})

	// A flood of 10,000 pings in one write is answered (or refused with
	// RATE_LIMITED) in bounded time, and another client meanwhile is
	// served normally. Run before the parallel subtests.
	t.Run("PingFlood", func(t *testing.T) {
		r, _ := authedRaw(t, env)
		const n = 10000
		var buf []byte
		for i := range n {
			buf = append(buf, mustFrame(t, wire.Request{T: wire.TPing, Rid: fmt.Sprint(i)})...)
		}
		start := time.Now()
		r.write(buf)
		dev := newUser(t, env, "flood-other")
		healthy := make(chan time.Duration, 1)
		go func() {
			// Another client during the flood (assertServerHealthy calls
			// t.Fatal, so it runs here only as a timing probe).
			hs := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := client.Dial(ctx, env.Addr, dev.ID, dev.Token, client.DialOptions{})
			if err == nil {
				err = c.Ping(ctx)
				c.Close()
			}
			if err != nil {
				healthy <- -1
				return
			}
			healthy <- time.Since(hs)
		}()
		pongs, limited := 0, 0
		for range n {
			m, closed := r.next(20 * time.Second)
			if closed {
				t.Fatalf("closed after %d pongs, %d RATE_LIMITED: %v", pongs, limited, r.err)
			}
			switch {
			case m.T == wire.TPong:
				pongs++
			case m.T == wire.TError && m.Code == wire.RateLimited && m.RetryAfterMs > 0:
				limited++
			default:
				t.Fatalf("flood: %+v", m)
			}
		}
		took := time.Since(start)
		t.Logf("%d pings: %d pongs, %d RATE_LIMITED in %v", n, pongs, limited, took)
		if d := <-healthy; d < 0 || d > 5*time.Second {
			t.Fatalf("another client during the flood: %v", d)
		}
		r.ping()
		assertServerHealthy(t, env)
	})

	// The same with requests that go to the request goroutine: each is
	// answered or refused with RATE_LIMITED; none is lost, nothing stalls.
	t.Run("RequestFlood", func(t *testing.T) {
		r, dev := authedRaw(t, env)
		conv := name("c-flood")
		env.Group(t, conv, dev.User)
		const n = 5000
		var buf []byte
		for i := range n {
			buf = append(buf, mustFrame(t, wire.Request{T: wire.TSync, Rid: fmt.Sprint(i), Conv: conv})...)
		}
		start := time.Now()
		r.write(buf)
		seen := map[string]bool{}
		ok, limited := 0, 0
		for range n {
			m, closed := r.next(20 * time.Second)
			if closed {
				t.Fatalf("closed after %d answers: %v", ok+limited, r.err)
			}
			switch {
			case m.T == wire.TSyncOK && m.Head == 1:
				ok++
			case m.T == wire.TError && m.Code == wire.RateLimited && m.RetryAfterMs > 0:
				limited++
			default:
				t.Fatalf("flood: %+v", m)
			}
			if seen[m.Rid] {
				t.Fatalf("rid %s answered twice", m.Rid)
			}
			seen[m.Rid] = true
		}
		t.Logf("%d syncs: %d answered, %d RATE_LIMITED in %v", n, ok, limited, time.Since(start))
		r.ping()
		assertServerHealthy(t, env)
	})

	// A body over max_body: TOO_LARGE, rid echoed, the connection stays
	// open; max_body itself is fine.
	t.Run("BodyOverMaxBody", func(t *testing.T) {
		t.Parallel()
		r, dev := authedRaw(t, env)
		conv := name("c-body")
		env.Group(t, conv, dev.User)
		r.send(wire.Request{T: wire.TSend, Rid: "big", Conv: conv, Cmid: "m1", Body: make([]byte, env.Cfg.MaxBody+1)})
		r.expectError(wire.TooLarge, "big")
		r.ping()
		r.send(wire.Request{T: wire.TSend, Rid: "max", Conv: conv, Cmid: "m2", Body: make([]byte, env.Cfg.MaxBody)})
		if m := r.expect(wire.TSendOK); m.Rid != "max" || m.Seq != 2 {
			t.Fatalf("send_ok = %+v (the refused body must not have taken a seq)", m)
		}
		assertServerHealthy(t, env)
	})

	// Sending faster than send_rate (burst send_burst): RATE_LIMITED with
	// retry_after_ms > 0, nothing committed for the refused sends, and a
	// send after retry_after_ms goes through.
	t.Run("SendRate", func(t *testing.T) {
		t.Parallel()
		r, dev := authedRaw(t, env)
		conv := name("c-rate")
		env.Group(t, conv, dev.User)
		var buf []byte
		const n = 8
		for i := range n {
			buf = append(buf, mustFrame(t, wire.Request{T: wire.TSend, Rid: fmt.Sprint(i), Conv: conv, Cmid: fmt.Sprint("m", i), Body: []byte("x")})...)
		}
		r.write(buf)
		sent, limited := 0, 0
		var retry int64
		for range n {
			m, closed := r.next(5 * time.Second)
			switch {
			case closed:
				t.Fatalf("closed: %v", r.err)
			case m.T == wire.TSendOK:
				sent++
			case m.T == wire.TError && m.Code == wire.RateLimited:
				limited++
				if m.RetryAfterMs <= 0 || m.RetryAfterMs > 1000/int64(env.Cfg.SendRate)+1 {
					t.Fatalf("retry_after_ms = %d", m.RetryAfterMs)
				}
				retry = max(retry, m.RetryAfterMs)
			default:
				t.Fatalf("send: %+v", m)
			}
		}
		if sent < env.Cfg.SendBurst || limited == 0 || sent+limited != n {
			t.Fatalf("%d sent, %d limited; burst is %d", sent, limited, env.Cfg.SendBurst)
		}
		r.send(wire.Request{T: wire.TSync, Rid: "s", Conv: conv})
		if m := r.expect(wire.TSyncOK); m.Head != int64(1+sent) {
			t.Fatalf("head = %d after %d accepted sends", m.Head, sent)
		}
		time.Sleep(time.Duration(retry) * time.Millisecond) // on purpose: the wait the server asked for
		r.send(wire.Request{T: wire.TSend, Rid: "later", Conv: conv, Cmid: "later", Body: []byte("x")})
		if m := r.expect(wire.TSendOK); m.Rid != "later" {
			t.Fatalf("after retry_after_ms: %+v", m)
		}
		assertServerHealthy(t, env)
	})
}

// ---- slow consumers ----

// dialSlow connects with a small receive buffer, authenticates, and then
// reads nothing until the test calls readFrom.
func dialSlow(t *testing.T, env *parleytest.Env, dev parleytest.Device) (net.Conn, *wire.FrameReader) {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return errors.Join(err, serr)
	}}
	nc, err := d.Dial("tcp", env.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Write(mustFrame(t, wire.Request{T: wire.TAuth, Rid: "a", Device: dev.ID, Token: dev.Token})); err != nil {
		t.Fatal(err)
	}
	fr := wire.NewFrameReader(nc, 1<<20)
	for {
		body, err := fr.Next()
		if err != nil {
			t.Fatal(err)
		}
		m, err := wire.DecodeMessage(body)
		if err == nil && m.T == wire.TPush && m.Seq == 1 {
			continue // the join, pushed as soon as the device was routed
		}
		if err != nil || m.T != wire.TAuthOK {
			t.Fatalf("slow auth: %+v %v", m, err)
		}
		break
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, fr
}

// slowResult is what a slow client finds once it reads again.
type slowResult struct {
	pushes  []int64 // seqs of the pushes, in order
	hints   []wire.Message
	pongs   int
	endErr  error // why the stream ended; nil if it was still open at quiet
	lastMsg time.Time
}

// readFrom reads nc (through fr) until the server closes it or nothing
// arrives for quiet.
func readFrom(nc net.Conn, fr *wire.FrameReader, quiet time.Duration) slowResult {
	var res slowResult
	for {
		_ = nc.SetReadDeadline(time.Now().Add(quiet))
		body, err := fr.Next()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return res
			}
			res.endErr = err
			return res
		}
		m, err := wire.DecodeMessage(body)
		if err != nil {
			res.endErr = err
			return res
		}
		res.lastMsg = time.Now()
		switch m.T {
		case wire.TPush:
			res.pushes = append(res.pushes, m.Seq)
		case wire.THint:
			res.hints = append(res.hints, m)
		case wire.TPong:
			res.pongs++
		}
	}
}

// TestSlowConsumer: devices that stop reading while a busy group pushes
// large messages to them. The server's memory stays bounded, the device
// that keeps up gets every push promptly, a slow device that reads again
// gets the pushes that fitted and then a hint for the rest (which it syncs),
// and a slow device that neither reads nor sends is closed at idle_timeout.
func TestSlowConsumer(t *testing.T) {
	env := startEnv(t, func(c *config.Config) {
		c.MaxFrame = 65536
		c.MaxBody = 16384
		c.MaxOutbound = 1 << 20 // the default
		c.SendRate = 0
		c.IdleTimeout = 2 * time.Second
	})
	sender, fast := newUser(t, env, "snd"), newUser(t, env, "fast")
	slowA, slowB := newUser(t, env, "slowa"), newUser(t, env, "slowb")
	conv := name("c-slow")
	env.Group(t, conv, sender.User, fast.User, slowA.User, slowB.User)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var fastPushes, fastHints atomic.Int64
	var maxLag atomic.Int64 // ms from commit (push ts) to arrival at fast
	cf, err := client.Dial(ctx, env.Addr, fast.ID, fast.Token, client.DialOptions{OnServerFrame: func(m wire.Message) {
		if m.T == wire.THint {
			fastHints.Add(1)
		}
		if m.T == wire.TPush && m.Seq > 1 { // not the join
			fastPushes.Add(1)
			lag := time.Now().UnixMilli() - m.Ts
			for {
				old := maxLag.Load()
				if lag <= old || maxLag.CompareAndSwap(old, lag) {
					break
				}
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer cf.Close()
	cs, err := client.Dial(ctx, env.Addr, sender.ID, sender.Token, client.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	ncA, frA := dialSlow(t, env, slowA)
	ncB, frB := dialSlow(t, env, slowB)
	silentSince := time.Now() // slowB's last frame was its auth

	// slowA keeps writing (pings) without reading, so idle_timeout does
	// not apply to it; slowB goes silent. The fast device and the sender
	// ping too: the one only reads otherwise, and the other, on a slow
	// host, can wait longer than idle_timeout (2 s here) for its sends'
	// replies; either was closed mid-test for being idle.
	stopPing := make(chan struct{})
	var pingWG sync.WaitGroup
	pingWG.Add(1)
	go func() {
		defer pingWG.Done()
		for i := 0; ; i++ {
			select {
			case <-stopPing:
				return
			case <-time.After(500 * time.Millisecond):
			}
			_ = cf.Write(wire.Request{T: wire.TPing})
			_ = cs.Write(wire.Request{T: wire.TPing})
			b, _ := wire.AppendFrame(nil, wire.Request{T: wire.TPing, Rid: fmt.Sprint("keep", i)})
			_ = ncA.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := ncA.Write(b); err != nil {
				return
			}
		}
	}()

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	// 8 concurrent senders, 400 messages of 16 KiB: 6.4 MB for each slow
	// device, six times max_outbound.
	const n, workers = 400, 8
	body := make([]byte, env.Cfg.MaxBody)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	var head atomic.Int64
	var cmu sync.Mutex
	var confirmed []int64
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > n {
					return
				}
				ok, err := cs.Send(ctx, conv, fmt.Sprint("m", i), body)
				if err != nil {
					errs <- err
					return
				}
				cmu.Lock()
				confirmed = append(confirmed, ok.Seq)
				cmu.Unlock()
				for {
					h := head.Load()
					if ok.Seq <= h || head.CompareAndSwap(h, ok.Seq) {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("send: %v", err)
	}
	sentAt := time.Now()
	testenv.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if got := fastPushes.Load(); got != n {
			return fmt.Errorf("fast device got %d of %d pushes, %d hints", got, n, fastHints.Load())
		}
		return nil
	})
	t.Logf("fast device: all %d pushes %v after the last send_ok; max lag %d ms", n, time.Since(sentAt), maxLag.Load())
	if lag := maxLag.Load(); lag > 2000 {
		t.Fatalf("the device that keeps up waited %d ms for a push", lag)
	}

	// slowC never reads and never stops sending: pings with 32 KiB rids,
	// whose pongs pile up. Replies are never dropped, so the server must
	// disconnect it (at twice max_outbound) rather than buffer them.
	ncC, frC := dialSlow(t, env, newUser(t, env, "slowc"))
	ping := mustFrame(t, wire.Request{T: wire.TPing, Rid: strings.Repeat("r", 32<<10)})
	wrote, werr := 0, error(nil)
	for wrote < 64<<20 {
		_ = ncC.SetWriteDeadline(time.Now().Add(2 * time.Second))
		if _, werr = ncC.Write(ping); werr != nil {
			break
		}
		wrote += len(ping)
	}
	resC := readFrom(ncC, frC, 2*time.Second)
	t.Logf("non-reading pinger: wrote %d KB (%v), then read %d pongs, end: %v", wrote>>10, werr, resC.pongs, resC.endErr)
	if ne, ok := werr.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the server stopped reading a client's requests: %v", werr)
	}
	if werr == nil || resC.endErr == nil {
		t.Fatalf("a client that never reads its replies was not disconnected after %d MB of requests", wrote>>20)
	}

	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew %d KB while two devices held back %d MB each", grew>>10, n*len(body)>>20)
	if grew > 50<<20 {
		t.Fatalf("heap grew %d MB: the server buffers for slow devices", grew>>20)
	}
	assertServerHealthy(t, env)

	// slowB sent nothing for idle_timeout: it must have been closed,
	// however many hints it owes. Its reader finds what fitted into the
	// socket buffers, then the end of the stream.
	// (The gateway checks idle_timeout once a second.)
	// On purpose: idle_timeout passes. Nothing to poll: B must not read
	// meanwhile.
	time.Sleep(time.Until(silentSince.Add(env.Cfg.IdleTimeout + 1500*time.Millisecond)))
	resB := readFrom(ncB, frB, 2*time.Second)
	t.Logf("silent slow device: %d pushes (last seq %d), %d hints, end: %v", len(resB.pushes), last(resB.pushes), len(resB.hints), resB.endErr)
	if resB.endErr == nil {
		t.Fatalf("a slow device that sent nothing for %v was not closed (idle_timeout %v)", time.Since(silentSince), env.Cfg.IdleTimeout)
	}

	// slowA reads again: the pushes that fitted, in order, then a hint
	// for the rest; a sync from the last push catches up.
	close(stopPing)
	pingWG.Wait()
	resA := readFrom(ncA, frA, time.Second)
	t.Logf("slow device that reads again: %d pushes (last seq %d), %d pongs, hints %+v, end: %v", len(resA.pushes), last(resA.pushes), resA.pongs, resA.hints, resA.endErr)
	if resA.endErr != nil {
		t.Fatalf("the slow device that kept pinging was closed: %v", resA.endErr)
	}
	// Pushes may come in any order (concurrent senders); each at most
	// once. The client's cursor is the end of the gap-free prefix.
	got := map[int64]bool{}
	for _, s := range resA.pushes {
		if got[s] || s < 1 || s > head.Load() {
			t.Fatalf("slow device: push of seq %d (duplicate or out of range)", s)
		}
		got[s] = true
	}
	cursor := int64(1)
	for got[cursor+1] {
		cursor++
	}
	if int64(len(resA.pushes)) >= n {
		t.Fatalf("the slow device got every push (%d): the test did not overflow max_outbound", len(resA.pushes))
	}
	// (The redelivery scan may add hints of its own; none may claim more
	// than head.)
	hinted := false
	for _, h := range resA.hints {
		if h.Conv != conv || h.Head > head.Load() {
			t.Fatalf("hint %+v: want %s, head at most %d", h, conv, head.Load())
		}
		hinted = hinted || h.Head == head.Load()
	}
	if !hinted {
		t.Fatalf("hints = %+v, want one for %s with head %d", resA.hints, conv, head.Load())
	}
	// It resyncs with an ordinary client connection.
	ca, err := client.Dial(ctx, env.Addr, slowA.ID, slowA.Token, client.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	s, err := ca.Sync(ctx, conv, cursor, 1000)
	if err != nil || s.Head != head.Load() || int64(len(s.Events)) != head.Load()-cursor || s.More {
		t.Fatalf("catch-up sync after %d = head %d, %d events, %v", cursor, s.Head, len(s.Events), err)
	}
	// The fault experiment's count: what the slow device ends up with
	// (pushes up to its cursor, then the catch-up sync) against every
	// confirmed message.
	lost, dup, reordered := 0, 0, 0
	have := map[int64]int{}
	for seq := range got {
		if seq <= cursor {
			have[seq]++
		}
	}
	prev := cursor
	for _, e := range s.Events {
		have[e.Seq]++
		if e.Seq <= prev {
			reordered++
		}
		prev = e.Seq
	}
	for _, seq := range confirmed {
		switch have[seq] {
		case 0:
			lost++
		case 1:
		default:
			dup++
		}
	}
	t.Logf("slow consumer: %d confirmed messages: lost %d, duplicated %d, out of order %d", len(confirmed), lost, dup, reordered)
	if lost+dup+reordered != 0 {
		t.Fatalf("slow consumer: lost %d, duplicated %d, out of order %d", lost, dup, reordered)
	}
}

func last(xs []int64) int64 {
	if len(xs) == 0 {
		return 0
	}
	return xs[len(xs)-1]
}

// ---- never another user's data ----

// TestNotMember: a user cannot read, write or probe a conversation they
// are not in; a conversation that does not exist is answered the same way.
func TestNotMember(t *testing.T) {
	env := startEnv(t, nil)
	ana, ben, eve := newUser(t, env, "ana"), newUser(t, env, "ben"), newUser(t, env, "eve")
	conv := name("c-private")
	env.Group(t, conv, ana.User, ben.User)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ca, err := client.Dial(ctx, env.Addr, ana.ID, ana.Token, client.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	if _, err := ca.Send(ctx, conv, "secret", []byte("for ben only")); err != nil {
		t.Fatal(err)
	}
	direct, err := ca.CreateDirect(ctx, ben.User)
	if err != nil {
		t.Fatal(err)
	}

	r := dialRaw(t, env)
	r.strict = true // eve is in no conversation: any push is a leak
	r.auth(eve)
	msgs := map[string]string{}
	for _, c := range []string{conv, direct.Conv, name("c-nonexistent"), "d.nobody|noone"} {
		for _, req := range []wire.Request{
			{T: wire.TSync, Rid: "sync", Conv: c},
			{T: wire.TSync, Rid: "sync-after", Conv: c, After: 1},
			{T: wire.TSend, Rid: "send", Conv: c, Cmid: "x", Body: []byte("x")},
			{T: wire.TMembersAdd, Rid: "add", Conv: c, Users: []string{eve.User}},
			{T: wire.TLeave, Rid: "leave", Conv: c},
			{T: wire.TAck, Rid: "ack", Conv: c, Seq: 1},
		} {
			r.send(req)
			m := r.expectError(wire.NotMember, req.Rid)
			// The answer must not tell an existing conversation from a
			// missing one.
			if prev, ok := msgs[req.Rid]; ok && prev != m.Msg {
				t.Fatalf("%s on %s: msg %q, elsewhere %q: ids can be probed", req.T, c, m.Msg, prev)
			}
			msgs[req.Rid] = m.Msg
		}
	}
	// Nothing of it happened: eve was not added, nothing was sent, and
	// eve was pushed nothing when ana sent again.
	if _, err := ca.Send(ctx, conv, "secret2", []byte("still for ben only")); err != nil {
		t.Fatal(err)
	}
	s, err := ca.Sync(ctx, conv, 0, 0)
	if err != nil || len(s.Events) != 3 || s.Events[0].Kind != "join" || len(s.Events[0].Users) != 2 ||
		s.Events[1].Cmid != "secret" || s.Events[2].Cmid != "secret2" {
		t.Fatalf("ana's sync = %+v, %v", s, err)
	}
	// A refused request takes no seq: head is still the 3 events.
	if s.Head != 3 || s.Upto != 3 {
		t.Fatalf("head %d, upto %d after eve's refused requests: want 3", s.Head, s.Upto)
	}
	r.ping() // the next frame is the pong: no push reached eve
	assertServerHealthy(t, env)
	r.ping()
}
