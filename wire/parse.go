package wire

import (
	"encoding/binary"
	"math"
)

// A minimal msgpack reader over a byte slice, for decoding untrusted input.
// Every length the input claims is checked against the bytes that remain
// before anything is sliced, skipped or allocated, and nesting is bounded,
// so a hostile frame costs at most O(len(input)) time and memory.

// maxDepth bounds the nesting of maps and arrays (the top-level map is 1).
const maxDepth = 32

// value classes, from the first byte of a msgpack value
const (
	clInvalid = iota
	clNil
	clBool
	clInt
	clFloat
	clStr
	clBin
	clArray
	clMap
	clExt
)

var classOf [256]uint8

func init() {
	for c := 0; c < 256; c++ {
		var k uint8
		switch {
		case c <= 0x7f, c >= 0xe0:
			k = clInt
		case c <= 0x8f:
			k = clMap
		case c <= 0x9f:
			k = clArray
		case c <= 0xbf:
			k = clStr
		default:
			switch c {
			case 0xc0:
				k = clNil
			case 0xc2, 0xc3:
				k = clBool
			case 0xc4, 0xc5, 0xc6:
				k = clBin
			case 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
				k = clExt
			case 0xca, 0xcb:
				k = clFloat
			case 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3:
				k = clInt
			case 0xd9, 0xda, 0xdb:
				k = clStr
			case 0xdc, 0xdd:
				k = clArray
			case 0xde, 0xdf:
				k = clMap
			default: // 0xc1 (never used)
				k = clInvalid
			}
		}
		classOf[c] = k
	}
}

var classNames = [...]string{
	clInvalid: "invalid", clNil: "nil", clBool: "bool", clInt: "integer",
	clFloat: "float", clStr: "string", clBin: "bin", clArray: "array",
	clMap: "map", clExt: "ext",
}

// errTruncated and friends are the structural failures: the input is not
// one well-formed msgpack value. DecodeRequest reports them as BAD_FRAME.
var (
	errTruncated = &Error{Code: BadFrame, Msg: "truncated msgpack"}
	errInvalid   = &Error{Code: BadFrame, Msg: "invalid msgpack"}
	errTooDeep   = &Error{Code: BadFrame, Msg: "msgpack nested too deeply"}
)

type reader struct {
	b   []byte
	off int
}

func (r *reader) rem() int { return len(r.b) - r.off }

// peek returns the class of the next value, or clInvalid at end of input.
func (r *reader) peek() uint8 {
	if r.off >= len(r.b) {
		return clInvalid
	}
	return classOf[r.b[r.off]]
}

// uintN reads an n-byte big-endian unsigned integer (n = 1, 2, 4, 8).
func (r *reader) uintN(n int) (uint64, *Error) {
	if r.rem() < n {
		return 0, errTruncated
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	switch n {
	case 1:
		return uint64(p[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), nil
	}
	return binary.BigEndian.Uint64(p), nil
}

// mapLen reads a map header. Each entry takes at least 2 bytes, so a count
// the remaining input cannot hold is rejected before anything else happens.
func (r *reader) mapLen() (int, *Error) {
	if r.off >= len(r.b) {
		return 0, errTruncated
	}
	c := r.b[r.off]
	r.off++
	var n uint64
	switch {
	case c >= 0x80 && c <= 0x8f:
		n = uint64(c & 0x0f)
	case c == 0xde:
		v, err := r.uintN(2)
		if err != nil {
			return 0, err
		}
		n = v
	case c == 0xdf:
		v, err := r.uintN(4)
		if err != nil {
			return 0, err
		}
		n = v
	default:
		r.off--
		return 0, errInvalid
	}
	if n > uint64(r.rem())/2 {
		return 0, errTruncated
	}
	return int(n), nil
}

// arrayLen reads an array header; every element takes at least 1 byte.
func (r *reader) arrayLen() (int, *Error) {
	if r.off >= len(r.b) {
		return 0, errTruncated
	}
	c := r.b[r.off]
	r.off++
	var n uint64
	switch {
	case c >= 0x90 && c <= 0x9f:
		n = uint64(c & 0x0f)
	case c == 0xdc:
		v, err := r.uintN(2)
		if err != nil {
			return 0, err
		}
		n = v
	case c == 0xdd:
		v, err := r.uintN(4)
		if err != nil {
			return 0, err
		}
		n = v
	default:
		r.off--
		return 0, errInvalid
	}
	if n > uint64(r.rem()) {
		return 0, errTruncated
	}
	return int(n), nil
}

// raw reads a str or bin value and returns its bytes, aliasing the input.
func (r *reader) raw() ([]byte, *Error) {
	if r.off >= len(r.b) {
		return nil, errTruncated
	}
	c := r.b[r.off]
	r.off++
	var n uint64
	var err *Error
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n = uint64(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		n, err = r.uintN(1)
	case c == 0xda || c == 0xc5:
		n, err = r.uintN(2)
	case c == 0xdb || c == 0xc6:
		n, err = r.uintN(4)
	default:
		r.off--
		return nil, errInvalid
	}
	if err != nil {
		return nil, err
	}
	if n > uint64(r.rem()) {
		return nil, errTruncated
	}
	p := r.b[r.off : r.off+int(n) : r.off+int(n)]
	r.off += int(n)
	return p, nil
}

// int reads any msgpack integer. ok is false (and the value consumed) for
// an unsigned value above MaxInt64.
func (r *reader) int() (v int64, ok bool, err *Error) {
	if r.off >= len(r.b) {
		return 0, false, errTruncated
	}
	c := r.b[r.off]
	r.off++
	switch {
	case c <= 0x7f:
		return int64(c), true, nil
	case c >= 0xe0:
		return int64(int8(c)), true, nil
	}
	var u uint64
	switch c {
	case 0xcc:
		u, err = r.uintN(1)
	case 0xcd:
		u, err = r.uintN(2)
	case 0xce:
		u, err = r.uintN(4)
	case 0xcf:
		u, err = r.uintN(8)
		if err == nil && u > math.MaxInt64 {
			return 0, false, nil
		}
	case 0xd0:
		u, err = r.uintN(1)
		return int64(int8(u)), true, err
	case 0xd1:
		u, err = r.uintN(2)
		return int64(int16(u)), true, err
	case 0xd2:
		u, err = r.uintN(4)
		return int64(int32(u)), true, err
	case 0xd3:
		u, err = r.uintN(8)
		return int64(u), true, err
	default:
		r.off--
		return 0, false, errInvalid
	}
	return int64(u), true, err
}

// skip skips one value of any type. depth is the nesting level of the
// value being skipped (the top-level map is 1).
func (r *reader) skip(depth int) *Error {
	if r.off >= len(r.b) {
		return errTruncated
	}
	c := r.b[r.off]
	switch classOf[c] {
	case clNil, clBool:
		r.off++
		return nil
	case clInt:
		_, _, err := r.int()
		return err
	case clFloat:
		n := 5
		if c == 0xcb {
			n = 9
		}
		if r.rem() < n {
			return errTruncated
		}
		r.off += n
		return nil
	case clStr, clBin:
		_, err := r.raw()
		return err
	case clExt:
		r.off++
		var n uint64
		var err *Error
		switch c {
		case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16
			n = 1 << (c - 0xd4)
		case 0xc7:
			n, err = r.uintN(1)
		case 0xc8:
			n, err = r.uintN(2)
		case 0xc9:
			n, err = r.uintN(4)
		}
		if err != nil {
			return err
		}
		n++ // the type byte
		if n > uint64(r.rem()) {
			return errTruncated
		}
		r.off += int(n)
		return nil
	case clArray, clMap:
		if depth > maxDepth {
			return errTooDeep
		}
		var n int
		var err *Error
		if classOf[c] == clArray {
			n, err = r.arrayLen()
		} else {
			n, err = r.mapLen()
			n *= 2
		}
		if err != nil {
			return err
		}
		for ; n > 0; n-- {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	return errInvalid
}

// validate checks that b is exactly one well-formed msgpack value within
// the depth bound, without allocating.
func validate(b []byte) *Error {
	r := reader{b: b}
	if err := r.skip(1); err != nil {
		return err
	}
	if r.off != len(r.b) {
		return &Error{Code: BadFrame, Msg: "trailing bytes after msgpack value"}
	}
	return nil
}
