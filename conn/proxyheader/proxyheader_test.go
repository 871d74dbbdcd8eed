package proxyheader

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

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
		[]byte(v2Sig + "\x21\x11\xff\xff"),
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
		n, err := Len(stream[:end])
		if err != nil {
			return proxyOutcome{refused: true}
		}
		if n == 0 {
			if end >= v1Max && stream[0] == 'P' {
				t.Fatalf("no verdict on %d bytes of a v1 header: %q", end, stream[:end])
			}
			continue
		}
		if n > end || n > v2Fixed+v2MaxLen {
			t.Fatalf("header of %d bytes out of %d arrived", n, end)
		}
		addr, err := Parse(stream[:n], fuzzPeer)
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
		{v2Sig[:7], "wait", 0},
		{v2Sig + "\x21\x11\x00\x0c" + "\x7f\x00\x00\x07\x7f\x00\x00\x01\x9c\x40\x1b\x9e", "127.0.0.7", 28},
		{v2Sig + "\x21\x11\x00\x0c" + "\x7f\x00", "wait", 0},
		{v2Sig + "\x21\x11\x00\x02" + "\x7f\x00", "", 0}, // too short for IPv4 addresses
		{v2Sig + "\x20\x00\x00\x00", "10.9.9.9", 16},     // LOCAL (a health check): the peer's
		{v2Sig + "\x21\x11\xff\xff", "", 0},              // declares 64 KiB: refused up front
		{v2Sig + "\x31\x11\x00\x00", "", 0},              // version 3
	} {
		n, err := Len([]byte(c.in))
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
		addr, err := Parse([]byte(c.in)[:n], fuzzPeer)
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
