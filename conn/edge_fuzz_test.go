package conn

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"reflect"
	"testing"

	"github.com/gobwas/ws"
	proxyproto "github.com/pires/go-proxyproto"
)

// The PROXY header and WebSocket frame parsers run on the event loop over
// bytes that may arrive in any split: the fuzz targets feed every input
// whole and in two parts at every split point, and require the same
// outcome, no panic, and nothing consumed beyond what arrived.

var fuzzPeer = netip.MustParseAddr("10.9.9.9")

func proxySeeds() [][]byte {
	v2 := func(cmd proxyproto.ProtocolVersionAndCommand, src, dst string) []byte {
		h := &proxyproto.Header{Version: 2, Command: cmd, TransportProtocol: proxyproto.TCPv4,
			SourceAddr:      net.TCPAddrFromAddrPort(netip.MustParseAddrPort(src)),
			DestinationAddr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(dst))}
		if netip.MustParseAddrPort(src).Addr().Is6() {
			h.TransportProtocol = proxyproto.TCPv6
		}
		b, err := h.Format()
		if err != nil {
			panic(err)
		}
		return b
	}
	return [][]byte{
		[]byte("PROXY TCP4 127.0.0.7 127.0.0.1 40000 7070\r\n"),
		[]byte("PROXY TCP6 ::1 ::1 40000 7070\r\n"),
		[]byte("PROXY UNKNOWN\r\n"),
		[]byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r"),
		[]byte("PROXY TCP4 999.2.3.4 5.6.7.8 1 2\r\n"),
		v2(proxyproto.PROXY, "127.0.0.7:40000", "127.0.0.1:7070"),
		v2(proxyproto.PROXY, "[2001:db8::1]:40000", "[::1]:7070"),
		v2(proxyproto.LOCAL, "127.0.0.1:1", "127.0.0.1:2"),
		[]byte(proxyV2Sig + "\x21\x11\xff\xff"),
		[]byte("GET / HTTP/1.1\r\n\r\n"),
		{0, 0, 0, 5, 0x81},
	}
}

// proxyOutcome is what the gateway does with stream: the header length
// and address it takes, or that it refuses.
type proxyOutcome struct {
	n       int
	addr    netip.Addr
	refused bool
}

// readProxy feeds stream as the loop would see it arriving in parts (cut
// at the given offsets).
func readProxy(t *testing.T, stream []byte, cuts ...int) proxyOutcome {
	for _, end := range append(cuts, len(stream)) {
		n, err := proxyHeaderLen(stream[:end])
		if err != nil {
			return proxyOutcome{refused: true}
		}
		if n == 0 {
			if end >= proxyV1Max && stream[0] == 'P' {
				t.Fatalf("no verdict on %d bytes of a v1 header: %q", end, stream[:end])
			}
			continue
		}
		if n > end || n > proxyV2Fixed+proxyV2MaxLen {
			t.Fatalf("header of %d bytes out of %d arrived", n, end)
		}
		addr, err := parseProxyHeader(stream[:n], fuzzPeer)
		if err != nil {
			return proxyOutcome{n: n, refused: true}
		}
		if !addr.IsValid() {
			t.Fatalf("accepted header %q gave no address", stream[:n])
		}
		return proxyOutcome{n: n, addr: addr}
	}
	return proxyOutcome{} // still waiting
}

func FuzzProxyHeader(f *testing.F) {
	for _, s := range proxySeeds() {
		f.Add(s)
		f.Add(append(append([]byte(nil), s...), "trailing frame bytes"...))
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		whole := readProxy(t, stream)
		for cut := 1; cut < len(stream); cut++ {
			if got := readProxy(t, stream, cut); got != whole {
				t.Fatalf("split at %d: %+v, whole: %+v", cut, got, whole)
			}
		}
	})
}

func TestProxyHeaderParse(t *testing.T) {
	for _, c := range []struct {
		in      string
		want    string // address, "" when refused, "wait" when incomplete
		wantLen int
	}{
		{"PROXY TCP4 127.0.0.7 127.0.0.1 40000 7070\r\nrest", "127.0.0.7", 43},
		{"PROXY TCP6 2001:db8::5 ::1 40000 7070\r\n", "2001:db8::5", 39},
		{"PROXY UNKNOWN\r\n", "10.9.9.9", 15}, // no address: the peer's
		{"PROXY TCP4 127.0.0.7", "wait", 0},
		{"PROX", "wait", 0},
		{"PROXY TCP4 nonsense\r\n", "", 0},
		{"PRXY TCP4", "", 0},
		{"HELLO", "", 0},
		{"\x00\x00\x00\x05", "", 0},
		{"PROXY " + string(bytes.Repeat([]byte("1"), 120)), "", 0}, // no CRLF within 107 bytes
		{proxyV2Sig[:7], "wait", 0},
		{proxyV2Sig + "\x21\x11\x00\x0c" + "\x7f\x00\x00\x07\x7f\x00\x00\x01\x9c\x40\x1b\x9e", "127.0.0.7", 28},
		{proxyV2Sig + "\x21\x11\x00\x0c" + "\x7f\x00", "wait", 0},
		{proxyV2Sig + "\x21\x11\x00\x02" + "\x7f\x00", "", 0}, // too short for IPv4 addresses
		{proxyV2Sig + "\x20\x00\x00\x00", "10.9.9.9", 16},     // LOCAL (a health check): the peer's
		{proxyV2Sig + "\x21\x11\xff\xff", "", 0},              // declares 64 KiB: refused up front
		{proxyV2Sig + "\x31\x11\x00\x00", "", 0},              // version 3
	} {
		n, err := proxyHeaderLen([]byte(c.in))
		switch {
		case c.want == "wait":
			if n != 0 || err != nil {
				t.Errorf("%q: len %d, %v; want to wait", c.in, n, err)
			}
			continue
		case err != nil:
			if c.want != "" {
				t.Errorf("%q: %v", c.in, err)
			}
			continue
		}
		addr, err := parseProxyHeader([]byte(c.in)[:n], fuzzPeer)
		if c.want == "" {
			if err == nil {
				t.Errorf("%q: accepted as %v", c.in, addr)
			}
			continue
		}
		if err != nil || addr.String() != c.want || n != c.wantLen {
			t.Errorf("%q: %v (%d bytes), %v; want %s (%d bytes)", c.in, addr, n, err, c.want, c.wantLen)
		}
	}
}

// wsClientFrame builds a client frame (masked unless mask is false).
func wsClientFrame(op ws.OpCode, fin, mask bool, payload []byte) []byte {
	f := ws.NewFrame(op, fin, append([]byte(nil), payload...))
	if mask {
		f = ws.MaskFrameWith(f, [4]byte{1, 2, 3, 4})
	}
	b, err := ws.CompileFrame(f)
	if err != nil {
		panic(err)
	}
	return b
}

const fuzzMaxMsg = 1024

// wsOutcome is the sequence of events (or the error) a stream gives.
type wsOutcome struct {
	events []string
	err    string
}

// readWS runs a reader over stream arriving in parts (cut at the given
// offsets), as the event loop does: every complete frame in the buffer,
// then wait for more.
func readWS(t *testing.T, stream []byte, cuts ...int) wsOutcome {
	stream = append([]byte(nil), stream...) // unmasked in place
	var r wsReader
	var out wsOutcome
	start := 0
	for _, end := range append(cuts, len(stream)) {
		for {
			ev, n, err := r.next(stream[start:end], fuzzMaxMsg)
			if err != nil {
				out.err = err.reason
				return out
			}
			if n == 0 {
				break
			}
			if n > end-start {
				t.Fatalf("consumed %d of %d bytes", n, end-start)
			}
			if len(ev.payload) > fuzzMaxMsg {
				t.Fatalf("message of %d bytes over max %d", len(ev.payload), fuzzMaxMsg)
			}
			if len(r.frag) > fuzzMaxMsg || r.fragCount > wsMaxFragments {
				t.Fatalf("reassembly holds %d bytes in %d frames", len(r.frag), r.fragCount)
			}
			out.events = append(out.events, string(rune('0'+ev.kind))+string(ev.payload)+string(rune(ev.code)))
			start += n
		}
	}
	return out
}

func wsSeeds() [][]byte {
	var s [][]byte
	bin := wsClientFrame(ws.OpBinary, true, true, []byte("\x81\xa1t\xa4ping"))
	s = append(s, bin)
	s = append(s, append(wsClientFrame(ws.OpBinary, false, true, []byte("ab")),
		append(wsClientFrame(ws.OpPing, true, true, []byte("p")),
			wsClientFrame(ws.OpContinuation, true, true, []byte("cd"))...)...))
	s = append(s, wsClientFrame(ws.OpText, true, true, []byte("text")))
	s = append(s, wsClientFrame(ws.OpBinary, true, false, []byte("unmasked")))
	s = append(s, wsClientFrame(ws.OpClose, true, true, ws.NewCloseFrameBody(ws.StatusNormalClosure, "bye")))
	s = append(s, wsClientFrame(ws.OpBinary, true, true, make([]byte, 300)))
	s = append(s, wsClientFrame(ws.OpBinary, true, true, make([]byte, fuzzMaxMsg+1)))
	s = append(s, []byte{0x82, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4})
	s = append(s, wsClientFrame(ws.OpContinuation, true, true, []byte("x")))
	return s
}

func FuzzWSFrames(f *testing.F) {
	for _, s := range wsSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		whole := readWS(t, stream)
		for _, cut := range []int{1, len(stream) / 3, len(stream) / 2, len(stream) - 1} {
			if cut <= 0 || cut >= len(stream) {
				continue
			}
			if got := readWS(t, stream, cut); !reflect.DeepEqual(got, whole) {
				t.Fatalf("split at %d: %+v, whole: %+v", cut, got, whole)
			}
		}
	})
}

func TestWSReader(t *testing.T) {
	ping := []byte("\x81\xa1t\xa4ping")
	cat := func(fs ...[]byte) []byte { return bytes.Join(fs, nil) }
	frag := func(n int) []byte { // a message of n empty-ish fragments
		b := wsClientFrame(ws.OpBinary, false, true, []byte("a"))
		for i := 1; i < n-1; i++ {
			b = append(b, wsClientFrame(ws.OpContinuation, false, true, nil)...)
		}
		return append(b, wsClientFrame(ws.OpContinuation, true, true, []byte("b"))...)
	}
	for _, c := range []struct {
		name   string
		stream []byte
		want   []wsEventKind
		err    string
	}{
		{"binary", wsClientFrame(ws.OpBinary, true, true, ping), []wsEventKind{wsBinary}, ""},
		{"fragmented with a ping inside", cat(wsClientFrame(ws.OpBinary, false, true, ping[:3]),
			wsClientFrame(ws.OpPing, true, true, []byte("hi")),
			wsClientFrame(ws.OpContinuation, true, true, ping[3:])), []wsEventKind{wsNothing, wsPing, wsBinary}, ""},
		{"text", wsClientFrame(ws.OpText, true, true, []byte("hi")), []wsEventKind{wsText}, ""},
		{"pong", wsClientFrame(ws.OpPong, true, true, nil), []wsEventKind{wsNothing}, ""},
		{"close", wsClientFrame(ws.OpClose, true, true, ws.NewCloseFrameBody(ws.StatusGoingAway, "")), []wsEventKind{wsClose}, ""},
		{"unmasked", wsClientFrame(ws.OpBinary, true, false, ping), nil, "unmasked"},
		{"reserved opcode", wsClientFrame(3, true, true, ping), nil, "protocol"},
		{"rsv bit", func() []byte { b := wsClientFrame(ws.OpBinary, true, true, ping); b[0] |= 0x40; return b }(), nil, "protocol"},
		{"continuation first", wsClientFrame(ws.OpContinuation, true, true, ping), nil, "protocol"},
		{"new message inside a fragmented one", cat(wsClientFrame(ws.OpBinary, false, true, ping),
			wsClientFrame(ws.OpBinary, true, true, ping)), []wsEventKind{wsNothing}, "protocol"},
		{"fragmented ping", wsClientFrame(ws.OpPing, false, true, nil), nil, "protocol"},
		{"long ping", wsClientFrame(ws.OpPing, true, true, make([]byte, 126)), nil, "protocol"},
		{"bad close code", wsClientFrame(ws.OpClose, true, true, []byte{0x03, 0xe7}), nil, "protocol"},
		{"exactly max", wsClientFrame(ws.OpBinary, true, true, make([]byte, fuzzMaxMsg)), []wsEventKind{wsBinary}, ""},
		{"over max", wsClientFrame(ws.OpBinary, true, true, make([]byte, fuzzMaxMsg+1)), nil, "too_large"},
		{"over max from the header alone", wsClientFrame(ws.OpBinary, true, true, make([]byte, 70000))[:14], nil, "too_large"},
		{"fragments over max", cat(wsClientFrame(ws.OpBinary, false, true, make([]byte, 1000)),
			wsClientFrame(ws.OpContinuation, true, true, make([]byte, 25))), []wsEventKind{wsNothing}, "too_large"},
		{"most fragments", frag(wsMaxFragments), append(make([]wsEventKind, wsMaxFragments-1), wsBinary), ""},
		{"too many fragments", frag(wsMaxFragments + 1), make([]wsEventKind, wsMaxFragments), "fragments"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r wsReader
			b := c.stream
			var got []wsEventKind
			for {
				ev, n, err := r.next(b, fuzzMaxMsg)
				if err != nil {
					if err.reason != c.err {
						t.Fatalf("error %s (%s), want %q", err.reason, err.msg, c.err)
					}
					break
				}
				if n == 0 {
					if c.err != "" {
						t.Fatalf("no error, want %s", c.err)
					}
					if len(b) != 0 {
						t.Fatalf("%d bytes left", len(b))
					}
					break
				}
				got = append(got, ev.kind)
				if ev.kind == wsBinary && len(ev.payload) == len(ping) && !bytes.Equal(ev.payload, ping) {
					t.Fatalf("payload %q", ev.payload)
				}
				b = b[n:]
			}
			if !reflect.DeepEqual(got, c.want) && !(len(got) == 0 && len(c.want) == 0) {
				t.Fatalf("events %v, want %v", got, c.want)
			}
		})
	}
}

func TestAppendWSMessages(t *testing.T) {
	var frames []byte
	for _, n := range []int{0, 1, 125, 126, 65535, 65536} {
		frames = binary.BigEndian.AppendUint32(frames, uint32(n))
		frames = append(frames, bytes.Repeat([]byte{byte(n)}, n)...)
	}
	rd := bytes.NewReader(appendWSMessages(nil, frames))
	for _, n := range []int{0, 1, 125, 126, 65535, 65536} {
		f, err := ws.ReadFrame(rd)
		if err != nil || f.Header.OpCode != ws.OpBinary || !f.Header.Fin || f.Header.Masked || len(f.Payload) != n {
			t.Fatalf("message of %d: %+v, %v", n, f.Header, err)
		}
	}
	if rd.Len() != 0 {
		t.Fatalf("%d bytes left", rd.Len())
	}
	// In place: the same messages, while every frame fits 65535 bytes.
	if _, ok := wsMessagesInPlace(append([]byte(nil), frames...)); ok {
		t.Fatal("a frame of 65536 bytes converted in place")
	}
	var small []byte
	for _, n := range []int{0, 1, 125, 126, 127, 300, 65535, 3} {
		small = binary.BigEndian.AppendUint32(small, uint32(n))
		small = append(small, bytes.Repeat([]byte{byte(n % 251)}, n)...)
	}
	want := appendWSMessages(nil, small)
	got, ok := wsMessagesInPlace(small)
	if !ok || !bytes.Equal(got, want) {
		t.Fatalf("in place: ok %v, %d bytes, want %d", ok, len(got), len(want))
	}
}
