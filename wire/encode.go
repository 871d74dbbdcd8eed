package wire

import (
	"encoding/binary"
	"math"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// appender is implemented by every frame type of this package: it appends the
// msgpack encoding of the frame to b. The frame types are hand-encoded (no
// reflection) and each also implements msgpack.CustomEncoder with the same
// bytes, so msgpack.Marshal and AppendFrame agree.
type appender interface {
	appendMsgpack(b []byte) []byte
}

// AppendFrame appends a 4-byte big-endian length and the msgpack encoding of
// v to dst and returns the extended slice. The frame types of this package
// (replies, pushes, Request) are encoded by hand-written code: compact ints,
// `body` always as bin, optional fields omitted when empty, `t` defaulted to
// the type's frame name when left empty. Pass them by pointer to save the
// copy into the interface. Any other value is encoded with a pooled
// msgpack.Encoder (UseCompactInts(true)). On error dst is returned unchanged
// (truncated to its original length).
func AppendFrame(dst []byte, v any) ([]byte, error) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	if a, ok := v.(appender); ok {
		dst = a.appendMsgpack(dst)
	} else {
		var err error
		dst, err = encodeReflect(dst, v)
		if err != nil {
			return dst[:start], err
		}
	}
	return finishFrame(dst, start)
}

// finishFrame writes the length prefix of the frame that starts at
// dst[start] (its body encoded after the prefix's 4 bytes).
func finishFrame(dst []byte, start int) ([]byte, error) {
	n := len(dst) - start - HeaderLen
	if n > math.MaxUint32 {
		return dst[:start], Errorf(TooLarge, "frame of %d bytes", n)
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(n))
	return dst, nil
}

// Marshal returns the msgpack encoding of v without a length prefix, as
// AppendFrame encodes it.
func Marshal(v any) ([]byte, error) {
	if a, ok := v.(appender); ok {
		return a.appendMsgpack(nil), nil
	}
	return encodeReflect(nil, v)
}

// appendWriter is an io.Writer that appends to a slice.
type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

func (w *appendWriter) WriteByte(c byte) error {
	w.b = append(w.b, c)
	return nil
}

type pooledEncoder struct {
	w   appendWriter
	enc *msgpack.Encoder
}

var encoderPool = sync.Pool{New: func() any {
	pe := &pooledEncoder{}
	pe.enc = msgpack.NewEncoder(&pe.w)
	pe.enc.UseCompactInts(true)
	return pe
}}

// encodeReflect appends v's encoding by vmihailenco/msgpack.
func encodeReflect(dst []byte, v any) ([]byte, error) {
	pe := encoderPool.Get().(*pooledEncoder)
	pe.w.b = dst
	err := pe.enc.Encode(v)
	dst = pe.w.b
	pe.w.b = nil
	encoderPool.Put(pe)
	return dst, err
}

// scratchPool holds buffers for EncodeMsgpack when the encoder's writer is not
// one of ours.
var scratchPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// encodeCustom implements msgpack.CustomEncoder for a frame type: it appends
// straight into our own writer when it can, otherwise through a scratch buffer.
func encodeCustom(enc *msgpack.Encoder, a appender) error {
	w := enc.Writer()
	if aw, ok := w.(*appendWriter); ok {
		aw.b = a.appendMsgpack(aw.b)
		return nil
	}
	bp := scratchPool.Get().(*[]byte)
	b := a.appendMsgpack((*bp)[:0])
	_, err := w.Write(b)
	if cap(b) <= 64<<10 {
		*bp = b[:0]
		scratchPool.Put(bp)
	}
	return err
}

// ---- msgpack primitives (append style) ----

func appendNil(b []byte) []byte { return append(b, 0xc0) }

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 0xc3)
	}
	return append(b, 0xc2)
}

func appendStr(b []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = append(b, 0xda, byte(n>>8), byte(n))
	default:
		b = append(b, 0xdb, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return append(b, s...)
}

// appendBin writes p as msgpack bin; nil and empty both become an empty bin.
func appendBin(b []byte, p []byte) []byte {
	n := len(p)
	switch {
	case n <= math.MaxUint8:
		b = append(b, 0xc4, byte(n))
	case n <= math.MaxUint16:
		b = append(b, 0xc5, byte(n>>8), byte(n))
	default:
		b = append(b, 0xc6, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return append(b, p...)
}

// appendInt writes v in the smallest msgpack int form (like UseCompactInts).
func appendInt(b []byte, v int64) []byte {
	if v >= 0 {
		switch {
		case v < 128:
			return append(b, byte(v))
		case v <= math.MaxUint8:
			return append(b, 0xcc, byte(v))
		case v <= math.MaxUint16:
			return append(b, 0xcd, byte(v>>8), byte(v))
		case v <= math.MaxUint32:
			return append(b, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
		}
		return append(b, 0xcf, byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32),
			byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	switch {
	case v >= -32:
		return append(b, byte(v))
	case v >= math.MinInt8:
		return append(b, 0xd0, byte(v))
	case v >= math.MinInt16:
		return append(b, 0xd1, byte(v>>8), byte(v))
	case v >= math.MinInt32:
		return append(b, 0xd2, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	return append(b, 0xd3, byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32),
		byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

func appendMapLen(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x80|byte(n))
	case n <= math.MaxUint16:
		return append(b, 0xde, byte(n>>8), byte(n))
	}
	return append(b, 0xdf, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
}

func appendArrayLen(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return append(b, 0xdc, byte(n>>8), byte(n))
	}
	return append(b, 0xdd, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
}

func appendStrs(b []byte, ss []string) []byte {
	b = appendArrayLen(b, len(ss))
	for _, s := range ss {
		b = appendStr(b, s)
	}
	return b
}

// key/value helpers: keys are short constant strings.

func kvStr(b []byte, k, v string) []byte        { return appendStr(appendStr(b, k), v) }
func kvInt(b []byte, k string, v int64) []byte  { return appendInt(appendStr(b, k), v) }
func kvBool(b []byte, k string, v bool) []byte  { return appendBool(appendStr(b, k), v) }
func kvBin(b []byte, k string, v []byte) []byte { return appendBin(appendStr(b, k), v) }
func kvStrs(b []byte, k string, v []string) []byte {
	return appendStrs(appendStr(b, k), v)
}

func orT(t, def string) string {
	if t == "" {
		return def
	}
	return t
}

func count(conds ...bool) int {
	n := 0
	for _, c := range conds {
		if c {
			n++
		}
	}
	return n
}
