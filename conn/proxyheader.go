package conn

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"net/netip"

	proxyproto "github.com/pires/go-proxyproto"
)

// A PROXY protocol header (v1 or v2) in front of a connection from a
// trusted proxy names the client's address. The event loop sees the
// header's bytes as they arrive, possibly split across reads: proxyHeaderLen
// tells from the bytes so far whether the header is complete (and how long
// it is), and parseProxyHeader hands the complete header to
// go-proxyproto's parser.

const (
	proxyV1Prefix = "PROXY "
	proxyV1Max    = 107 // the longest v1 line, CRLF included
	proxyV2Sig    = "\r\n\r\n\x00\r\nQUIT\n"
	proxyV2Fixed  = 16 // signature, version and command, family, length
	// proxyV2MaxLen bounds the addresses and TLVs a v2 header may declare:
	// HAProxy sends a few dozen bytes; more is refused rather than buffered.
	proxyV2MaxLen = 4096
)

var (
	errProxyMissing   = errors.New("no PROXY protocol header")
	errProxyMalformed = errors.New("malformed PROXY protocol header")
)

// proxyHeaderLen returns the length of the PROXY header at the start of
// b, 0 if b is a prefix of one that needs more bytes, or an error if b
// cannot begin a header.
func proxyHeaderLen(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	switch b[0] {
	case 'P':
		n := min(len(b), len(proxyV1Prefix))
		if string(b[:n]) != proxyV1Prefix[:n] {
			return 0, errProxyMissing
		}
		if i := bytes.Index(b[:min(len(b), proxyV1Max)], []byte("\r\n")); i >= 0 {
			return i + 2, nil
		}
		if len(b) >= proxyV1Max {
			return 0, errProxyMalformed
		}
		return 0, nil
	case '\r':
		n := min(len(b), len(proxyV2Sig))
		if string(b[:n]) != proxyV2Sig[:n] {
			return 0, errProxyMissing
		}
		if len(b) < proxyV2Fixed {
			return 0, nil
		}
		l := int(b[14])<<8 | int(b[15])
		if l > proxyV2MaxLen {
			return 0, errProxyMalformed
		}
		if len(b) < proxyV2Fixed+l {
			return 0, nil
		}
		return proxyV2Fixed + l, nil
	}
	return 0, errProxyMissing
}

// parseProxyHeader parses the complete header h (proxyHeaderLen bytes) and
// returns the client's address: the header's source address, or peer when
// the header carries none (a v2 LOCAL command, such as a proxy's health
// check, or v1 UNKNOWN).
func parseProxyHeader(h []byte, peer netip.Addr) (netip.Addr, error) {
	hdr, err := proxyproto.Read(bufio.NewReaderSize(bytes.NewReader(h), max(len(h), 16)))
	if err != nil {
		return netip.Addr{}, errors.Join(errProxyMalformed, err)
	}
	if hdr.Command.IsLocal() || hdr.TransportProtocol == proxyproto.UNSPEC {
		return peer, nil
	}
	var ip net.IP
	switch a := hdr.SourceAddr.(type) {
	case *net.TCPAddr:
		ip = a.IP
	case *net.UDPAddr:
		ip = a.IP
	default: // a Unix socket: no address to speak of
		return peer, nil
	}
	addr, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Addr{}, errProxyMalformed
	}
	return addr.Unmap(), nil
}

// addrOf returns the IP of a socket address (the zero Addr if it has none).
func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.TCPAddr:
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap()
		}
	case nil:
	default:
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			return ap.Addr().Unmap()
		}
	}
	return netip.Addr{}
}
