package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

func frame(body []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	return append(b, body...)
}

func wantCode(t *testing.T, err error, code Code) {
	t.Helper()
	e, ok := AsError(err)
	if !ok {
		t.Fatalf("err = %v, want *Error %s", err, code)
	}
	if e.Code != code {
		t.Fatalf("code = %s (%s), want %s", e.Code, e.Msg, code)
	}
}

func TestNextFrame(t *testing.T) {
	full := frame([]byte{0x80})

	// partial header
	for i := 0; i < HeaderLen; i++ {
		body, n, err := NextFrame(full[:i], 100)
		if body != nil || n != 0 || err != nil {
			t.Fatalf("header %d bytes: %v %d %v", i, body, n, err)
		}
	}
	// partial body
	long := frame(bytes.Repeat([]byte{1}, 10))
	body, n, err := NextFrame(long[:9], 100)
	if body != nil || n != 0 || err != nil {
		t.Fatalf("partial body: %v %d %v", body, n, err)
	}
	// complete
	body, n, err = NextFrame(long, 100)
	if err != nil || n != 14 || len(body) != 10 || cap(body) != 10 {
		t.Fatalf("complete: len %d cap %d n %d err %v", len(body), cap(body), n, err)
	}
	// zero length: BAD_FRAME
	_, _, err = NextFrame([]byte{0, 0, 0, 0}, 100)
	wantCode(t, err, BadFrame)
	// max+1 with only the header present: TOO_LARGE
	_, _, err = NextFrame(binary.BigEndian.AppendUint32(nil, 101), 100)
	wantCode(t, err, TooLarge)
	_, _, err = NextFrame([]byte{0xff, 0xff, 0xff, 0xff}, 100)
	wantCode(t, err, TooLarge)
	// exactly max is fine
	body, _, err = NextFrame(frame(make([]byte, 100)), 100)
	if err != nil || len(body) != 100 {
		t.Fatalf("max: %d %v", len(body), err)
	}
	// max <= 0 means the default
	_, _, err = NextFrame(binary.BigEndian.AppendUint32(nil, DefaultMaxFrame+1), 0)
	wantCode(t, err, TooLarge)

	// two frames back to back, plus the start of a third
	var buf []byte
	buf, _ = AppendFrame(buf, &Pong{Rid: "a", Ts: 1})
	buf, _ = AppendFrame(buf, &Hint{Conv: "c", Head: 9})
	buf = append(buf, 0, 0)
	var got []Message
	for {
		body, n, err := NextFrame(buf, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		m, err := DecodeMessage(body)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m)
		buf = buf[n:]
	}
	if len(got) != 2 || got[0].T != TPong || got[0].Rid != "a" || got[1].T != THint || got[1].Head != 9 {
		t.Fatalf("got %+v", got)
	}
	if len(buf) != 2 {
		t.Fatalf("left %d bytes, want 2", len(buf))
	}
}

func TestFrameReader(t *testing.T) {
	var stream []byte
	bodies := [][]byte{{0x80}, bytes.Repeat([]byte{7}, 5000), {1, 2, 3}, bytes.Repeat([]byte{9}, 70000)}
	for _, b := range bodies {
		stream = append(stream, frame(b)...)
	}
	for name, r := range map[string]io.Reader{
		"whole":   bytes.NewReader(stream),
		"onebyte": iotest.OneByteReader(bytes.NewReader(stream)),
		"half":    iotest.HalfReader(bytes.NewReader(stream)),
		"dataerr": iotest.DataErrReader(bytes.NewReader(stream)),
	} {
		t.Run(name, func(t *testing.T) {
			fr := NewFrameReader(r, 100000)
			for i, want := range bodies {
				got, err := fr.Next()
				if err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("frame %d: got %d bytes, want %d", i, len(got), len(want))
				}
			}
			if _, err := fr.Next(); err != io.EOF {
				t.Fatalf("end: %v, want EOF", err)
			}
		})
	}

	// ends inside a frame
	fr := NewFrameReader(bytes.NewReader(stream[:10]), 0)
	if _, err := fr.Next(); err != nil {
		t.Fatal(err)
	}
	if _, err := fr.Next(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated: %v", err)
	}

	// too large, decided from the header
	fr = NewFrameReader(bytes.NewReader(frame(make([]byte, 5000))[:4]), 4096)
	_, err := fr.Next()
	wantCode(t, err, TooLarge)
	_, err = fr.Next()
	wantCode(t, err, TooLarge)

	// zero length
	fr = NewFrameReader(bytes.NewReader([]byte{0, 0, 0, 0}), 0)
	_, err = fr.Next()
	wantCode(t, err, BadFrame)
}

func TestErrors(t *testing.T) {
	e := Errorf(RateLimited, "slow down %d", 3)
	e.RetryAfterMs = 250
	if e.Error() != "RATE_LIMITED: slow down 3" {
		t.Fatal(e.Error())
	}
	wrapped := errors.Join(errors.New("x"), e)
	got, ok := AsError(wrapped)
	if !ok || got != e {
		t.Fatalf("AsError: %v %v", got, ok)
	}
	if !errors.Is(wrapped, &Error{Code: RateLimited}) || errors.Is(wrapped, &Error{Code: Internal}) {
		t.Fatal("errors.Is by code")
	}
	if _, ok := AsError(errors.New("plain")); ok {
		t.Fatal("AsError on a plain error")
	}
	if CodeOf(nil) != "" || CodeOf(errors.New("x")) != Internal || CodeOf(wrapped) != RateLimited {
		t.Fatal("CodeOf")
	}
	f := ErrorReply("r1", e)
	if f.T != TError || f.Rid != "r1" || f.Code != RateLimited || f.RetryAfterMs != 250 {
		t.Fatalf("%+v", f)
	}
	f = ErrorReply("r1", &Error{Code: NotMember, RetryAfterMs: 5})
	if f.RetryAfterMs != 0 {
		t.Fatal("retry_after_ms on a non RATE_LIMITED error")
	}
	f = ErrorReplyFor("", errors.New("pq: secret"))
	if f.Code != Internal || f.Msg != "internal error" {
		t.Fatalf("%+v", f)
	}
	for _, c := range Codes {
		if !c.Valid() {
			t.Fatal(c)
		}
	}
	if Code("NOPE").Valid() {
		t.Fatal("NOPE valid")
	}
}
