// Package proxyheader reads the PROXY protocol header (v1 or v2) that a
// trusted proxy puts in front of a connection to name the client's
// address. The gateway's event loop sees the header's bytes as they
// arrive, possibly split across reads: Len tells from the bytes so far
// whether the header is complete (and how long it is), and Parse hands the
// complete header to go-proxyproto's parser.
package proxyheader

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"net/netip"

	proxyproto "github.com/pires/go-proxyproto"
)

const (
	v1Prefix = "PROXY "
	// v1Max: the longest v1 line, CRLF included.
	v1Max   = 107
	v2Sig   = "\r\n\r\n\x00\r\nQUIT\n"
	v2Fixed = 16 // signature, version and command, family, length
	// v2MaxLen bounds the addresses and TLVs a v2 header may declare:
	// HAProxy sends a few dozen bytes; more is refused rather than buffered.
	v2MaxLen = 4096
)

var (
	// ErrMissing: the bytes cannot begin a PROXY header.
	ErrMissing = errors.New("no PROXY protocol header")
	// ErrMalformed: they begin one that is broken or too long.
	ErrMalformed = errors.New("malformed PROXY protocol header")
)

// Len returns the length of the PROXY header at the start of
// b, 0 if b is a prefix of one that needs more bytes, or an error if b
// cannot begin a header.
func Len(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	switch b[0] {
	case 'P':
		n := min(len(b), len(v1Prefix))
		if string(b[:n]) != v1Prefix[:n] {
			return 0, ErrMissing
		}
		if i := bytes.Index(b[:min(len(b), v1Max)], []byte("\r\n")); i >= 0 {
			return i + 2, nil
		}
		if len(b) >= v1Max {
			return 0, ErrMalformed
		}
		return 0, nil
	case '\r':
		n := min(len(b), len(v2Sig))
		if string(b[:n]) != v2Sig[:n] {
			return 0, ErrMissing
		}
		if len(b) < v2Fixed {
			return 0, nil
		}
		l := int(b[14])<<8 | int(b[15])
		if l > v2MaxLen {
			return 0, ErrMalformed
		}
		if len(b) < v2Fixed+l {
			return 0, nil
		}
		return v2Fixed + l, nil
	}
	return 0, ErrMissing
}

// Parse parses the complete header h (Len bytes) and
// returns the client's address: the header's source address, or peer when
// the header carries none (a v2 LOCAL command, such as a proxy's health
// check, or v1 UNKNOWN).
func Parse(h []byte, peer netip.Addr) (netip.Addr, error) {
	hdr, err := proxyproto.Read(bufio.NewReaderSize(bytes.NewReader(h), max(len(h), 16)))
	if err != nil {
		return netip.Addr{}, errors.Join(ErrMalformed, err)
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
		return netip.Addr{}, ErrMalformed
	}
	return addr.Unmap(), nil
}
