package wire

import (
	"bytes"
	"reflect"
	"testing"
)

// fuzzMaxFrame is the max_frame the fuzz targets frame with (the default).
const fuzzMaxFrame = 65536

// drain decodes every complete frame at the front of *buf, as the gateway's
// read loop does, and drops what it consumed. It reports false when the
// framing is broken (the server would close the connection).
func drain(t *testing.T, buf *[]byte) bool {
	for {
		body, n, err := NextFrame(*buf, fuzzMaxFrame)
		if err != nil {
			if _, ok := AsError(err); !ok {
				t.Fatalf("NextFrame: not an *Error: %v", err)
			}
			return false
		}
		if n == 0 {
			return true
		}
		checkRequest(t, body)
		*buf = (*buf)[n:]
	}
}

// checkRequest decodes one body and checks the decoder's invariants.
func checkRequest(t *testing.T, body []byte) {
	q, err := DecodeRequest(body)
	if err != nil {
		e, ok := AsError(err)
		if !ok || (e.Code != BadFrame && e.Code != BadRequest) {
			t.Fatalf("DecodeRequest: unexpected error %v", err)
		}
		if e.Code == BadRequest && q.T == "" {
			t.Fatalf("BAD_REQUEST without T: %v", err)
		}
		return
	}
	if _, ok := specOf(q.T); !ok {
		t.Fatalf("decoded unknown type %q", q.T)
	}
	// A decoded request re-encodes to the same request (restricted to the
	// fields of its type).
	enc, err := AppendFrame(nil, &q)
	if err != nil {
		t.Fatal(err)
	}
	q2, err := DecodeRequest(enc[HeaderLen:])
	if err != nil {
		t.Fatalf("re-decode: %v\n%+v", err, q)
	}
	want := project(q, q.Fields())
	if !reflect.DeepEqual(q2, want) {
		t.Fatalf("re-decode:\n got %+v\nwant %+v", q2, want)
	}
	// The body does not alias the input.
	if len(q.Body) > 0 {
		before := bytes.Clone(q.Body)
		for i := range body {
			body[i] ^= 0xff
		}
		if !bytes.Equal(before, q.Body) {
			t.Fatal("Body aliases the input")
		}
		for i := range body {
			body[i] ^= 0xff
		}
	}
}

// project keeps only the fields in fs (and T), with Has = fs.
func project(q Request, fs Field) Request {
	p := Request{T: q.T, Has: fs}
	if fs&FRid != 0 {
		p.Rid = q.Rid
	}
	if fs&FDevice != 0 {
		p.Device = q.Device
	}
	if fs&FToken != 0 {
		p.Token = q.Token
	}
	if fs&FJWT != 0 {
		p.JWT = q.JWT
	}
	if fs&FConv != 0 {
		p.Conv = q.Conv
	}
	if fs&FCmid != 0 {
		p.Cmid = q.Cmid
	}
	if fs&FKind != 0 {
		p.Kind = q.Kind
	}
	if fs&FTitle != 0 {
		p.Title = q.Title
	}
	if fs&FCursor != 0 {
		p.Cursor = q.Cursor
	}
	if fs&FBody != 0 {
		p.Body = q.Body
		if p.Body == nil {
			p.Body = []byte{}
		}
	}
	if fs&FSeq != 0 {
		p.Seq = q.Seq
	}
	if fs&FAfter != 0 {
		p.After = q.After
	}
	if fs&FLimit != 0 {
		p.Limit = q.Limit
	}
	if fs&FMembers != 0 {
		p.Members = q.Members
		if p.Members == nil {
			p.Members = []string{}
		}
	}
	if fs&FUsers != 0 {
		p.Users = q.Users
		if p.Users == nil {
			p.Users = []string{}
		}
	}
	if fs&FConvs != 0 {
		p.Convs = q.Convs
		if p.Convs == nil {
			p.Convs = []ConvAfter{}
		}
	}
	if fs&FMentionAll != 0 {
		p.MentionAll = q.MentionAll
	}
	if fs&FMentions != 0 {
		p.Mentions = q.Mentions
		if p.Mentions == nil {
			p.Mentions = []string{}
		}
	}
	if fs&FProvider != 0 {
		p.Provider = q.Provider
	}
	if fs&FSandbox != 0 {
		p.Sandbox = q.Sandbox
	}
	if fs&FMutedUntil != 0 {
		p.MutedUntil = q.MutedUntil
	}
	if fs&FReceiptsPrivate != 0 {
		p.ReceiptsPrivate = q.ReceiptsPrivate
	}
	if fs&FUser != 0 {
		p.User = q.User
	}
	if fs&FRole != 0 {
		p.Role = q.Role
	}
	if fs&FInvite != 0 {
		p.Invite = q.Invite
	}
	return p
}

// FuzzDecodeRequest feeds each input as a byte stream in two chunks
// (input[:half], then input[half:]) into an accumulating receive buffer that
// is drained with NextFrame + DecodeRequest after each chunk, as the
// gateway's read loop does (in the style of nats-server's parser fuzz test).
// Nothing may panic; decoded requests must re-encode to themselves.
func FuzzDecodeRequest(f *testing.F) {
	for _, q := range sampleRequests() {
		if len(q.Body) > 1000 {
			continue
		}
		fr, err := AppendFrame(nil, &q)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(fr)
		// the same body twice in one stream
		f.Add(append(bytes.Clone(fr), fr...))
		// the body without a prefix (fed to the framer as garbage)
		f.Add(fr[HeaderLen:])
	}
	for _, g := range [][]byte{
		{},
		{0, 0, 0, 0},
		{0, 0, 0, 1, 0xc1},
		{0xff, 0xff, 0xff, 0xff},
		{0, 1, 0, 1},
		frame([]byte{0x80}),
		frame([]byte{0xdf, 0xee, 0x6b, 0x28, 0x00, 0xa1, 't'}),
		frame([]byte{0xdf, 0xff, 0xff, 0xff, 0xff}),
		frame(cat([]byte{0x82}, fixstr("t"), fixstr("send"), fixstr("body"), []byte{0xc6, 0xff, 0xff, 0xff, 0xff, 1})),
		frame(cat([]byte{0x82}, fixstr("t"), fixstr("send"), fixstr("body"), []byte{0xdb, 0xff, 0xff, 0xff, 0xff, 1})),
		frame(cat([]byte{0x82}, fixstr("t"), fixstr("conv_create"), fixstr("members"), []byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0xa0})),
		frame(nested(40)),
		frame(nested(20)),
		frame([]byte{0x81, 0xa1, 't', 0x05}),
		frame([]byte{0x81, 0xa1, 't', 0xa3, 'b', 'a', 'd'}),
		frame([]byte{0x82, 0xa1, 't', 0xa3, 'a', 'c', 'k', 0xa3, 's', 'e', 'q', 0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0}),
		frame([]byte{0x83, 0xa1, 't', 0xa3, 'a', 'c', 'k', 0xa4, 'c', 'o', 'n', 'v', 0xa1, 'c', 0xa3, 's', 'e', 'q', 0xcb, 0x42, 0x78, 0xfd, 0xd0, 0x45, 0x67, 0xb0, 0x00}),
		frame([]byte{0x83, 0xa1, 't', 0xa4, 's', 'y', 'n', 'c', 0xa4, 'c', 'o', 'n', 'v', 0xa1, 'c', 0xa5, 'a', 'f', 't', 'e', 'r', 0xca, 0x40, 0x40, 0x00, 0x00}),
		frame([]byte{0x82, 0xa1, 't', 0xa4, 'p', 'i', 'n', 'g', 0xa1, 'x', 0xc9, 0, 0, 0, 2, 1, 0xaa, 0xbb}),
		frame([]byte{0x82, 0xa1, 't', 0xa4, 'p', 'i', 'n', 'g', 0xa1, 'x', 0xcb, 0, 0, 0, 0, 0, 0, 0, 0}),
		[]byte("PING\r\n"),
	} {
		f.Add(g)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var buf []byte
		half := len(data) / 2
		for _, chunk := range [][]byte{data[:half], data[half:]} {
			buf = append(buf, chunk...)
			if !drain(t, &buf) {
				return
			}
		}
		// The body alone, without framing.
		checkRequest(t, bytes.Clone(data))
	})
}

// FuzzDecodeMessage checks that the client-side decoder never panics and
// that everything it accepts is plain data.
func FuzzDecodeMessage(f *testing.F) {
	for _, rt := range replyTypes {
		v := reflect.New(reflect.TypeOf(rt.v))
		fill(v.Elem(), 0)
		b, err := Marshal(v.Interface())
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(nested(40))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeMessage(data)
		if err != nil {
			if e, ok := AsError(err); !ok || e.Code != BadFrame {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if m.T == "" {
			t.Fatal("decoded without t")
		}
	})
}
