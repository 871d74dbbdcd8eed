package wsframe

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"

	"github.com/gobwas/ws"
)

// The frame parser runs on the event loop over bytes that may arrive in
// any split: the fuzz target feeds every input whole and in two parts at
// several split points, and requires the same outcome, no panic, and
// nothing consumed beyond what arrived.

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
	var r Reader
	var out wsOutcome
	start := 0
	for _, end := range append(cuts, len(stream)) {
		for {
			ev, n, err := r.Next(stream[start:end], fuzzMaxMsg)
			if err != nil {
				out.err = err.Reason
				return out
			}
			if n == 0 {
				break
			}
			if n > end-start {
				t.Fatalf("consumed %d of %d bytes", n, end-start)
			}
			if len(ev.Payload) > fuzzMaxMsg {
				t.Fatalf("message of %d bytes over max %d", len(ev.Payload), fuzzMaxMsg)
			}
			if len(r.frag) > fuzzMaxMsg || r.fragCount > MaxFragments {
				t.Fatalf("reassembly holds %d bytes in %d frames", len(r.frag), r.fragCount)
			}
			out.events = append(out.events, string(rune('0'+ev.Kind))+string(ev.Payload)+string(rune(ev.Code)))
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
		want   []Kind
		err    string
	}{
		{"binary", wsClientFrame(ws.OpBinary, true, true, ping), []Kind{Binary}, ""},
		{"fragmented with a ping inside", cat(wsClientFrame(ws.OpBinary, false, true, ping[:3]),
			wsClientFrame(ws.OpPing, true, true, []byte("hi")),
			wsClientFrame(ws.OpContinuation, true, true, ping[3:])), []Kind{Nothing, Ping, Binary}, ""},
		{"text", wsClientFrame(ws.OpText, true, true, []byte("hi")), []Kind{Text}, ""},
		{"pong", wsClientFrame(ws.OpPong, true, true, nil), []Kind{Nothing}, ""},
		{"close", wsClientFrame(ws.OpClose, true, true, ws.NewCloseFrameBody(ws.StatusGoingAway, "")), []Kind{Close}, ""},
		{"unmasked", wsClientFrame(ws.OpBinary, true, false, ping), nil, "unmasked"},
		{"reserved opcode", wsClientFrame(3, true, true, ping), nil, "protocol"},
		{"rsv bit", func() []byte { b := wsClientFrame(ws.OpBinary, true, true, ping); b[0] |= 0x40; return b }(), nil, "protocol"},
		{"continuation first", wsClientFrame(ws.OpContinuation, true, true, ping), nil, "protocol"},
		{"new message inside a fragmented one", cat(wsClientFrame(ws.OpBinary, false, true, ping),
			wsClientFrame(ws.OpBinary, true, true, ping)), []Kind{Nothing}, "protocol"},
		{"fragmented ping", wsClientFrame(ws.OpPing, false, true, nil), nil, "protocol"},
		{"long ping", wsClientFrame(ws.OpPing, true, true, make([]byte, 126)), nil, "protocol"},
		{"bad close code", wsClientFrame(ws.OpClose, true, true, []byte{0x03, 0xe7}), nil, "protocol"},
		{"exactly max", wsClientFrame(ws.OpBinary, true, true, make([]byte, fuzzMaxMsg)), []Kind{Binary}, ""},
		{"over max", wsClientFrame(ws.OpBinary, true, true, make([]byte, fuzzMaxMsg+1)), nil, "too_large"},
		{"over max from the header alone", wsClientFrame(ws.OpBinary, true, true, make([]byte, 70000))[:14], nil, "too_large"},
		{"fragments over max", cat(wsClientFrame(ws.OpBinary, false, true, make([]byte, 1000)),
			wsClientFrame(ws.OpContinuation, true, true, make([]byte, 25))), []Kind{Nothing}, "too_large"},
		{"most fragments", frag(MaxFragments), append(make([]Kind, MaxFragments-1), Binary), ""},
		{"too many fragments", frag(MaxFragments + 1), make([]Kind, MaxFragments), "fragments"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r Reader
			b := c.stream
			var got []Kind
			for {
				ev, n, err := r.Next(b, fuzzMaxMsg)
				if err != nil {
					if err.Reason != c.err {
						t.Fatalf("error %s (%s), want %q", err.Reason, err.Msg, c.err)
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
				got = append(got, ev.Kind)
				if ev.Kind == Binary && len(ev.Payload) == len(ping) && !bytes.Equal(ev.Payload, ping) {
					t.Fatalf("payload %q", ev.Payload)
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
	rd := bytes.NewReader(AppendMessages(nil, frames))
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
	if _, ok := MessagesInPlace(append([]byte(nil), frames...)); ok {
		t.Fatal("a frame of 65536 bytes converted in place")
	}
	var small []byte
	for _, n := range []int{0, 1, 125, 126, 127, 300, 65535, 3} {
		small = binary.BigEndian.AppendUint32(small, uint32(n))
		small = append(small, bytes.Repeat([]byte{byte(n % 251)}, n)...)
	}
	want := AppendMessages(nil, small)
	got, ok := MessagesInPlace(small)
	if !ok || !bytes.Equal(got, want) {
		t.Fatalf("in place: ok %v, %d bytes, want %d", ok, len(got), len(want))
	}
}
