package wire

import (
	"bytes"
	"math"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// sampleRequests holds one valid request of every client type.
func sampleRequests() []Request {
	return []Request{
		{T: TAuth, Rid: "1", Device: "dev-1", Token: "tok"},
		{T: TAuth, Rid: "1j", JWT: "eyJ.eyJ.sig"},
		{T: TRefresh, Rid: "1r", JWT: "eyJ.eyJ.sig2"},
		{T: TPing},
		{T: TPing, Rid: "p"},
		{T: TConvCreate, Rid: "2", Kind: ConvGroup, Members: []string{"bob", "carol"}, Title: "team"},
		{T: TConvCreate, Rid: "3", Kind: ConvDirect, Members: []string{"bob"}, Conv: "c-given"},
		{T: TConvCreate, Rid: "3b", Kind: ConvGroup, Members: []string{}},
		{T: TMembersAdd, Rid: "4", Conv: "c1", Users: []string{"dave"}},
		{T: TLeave, Rid: "5", Conv: "c1"},
		{T: TSend, Rid: "6", Conv: "c1", Cmid: "m-1", Body: bytes.Repeat([]byte("x"), 100)},
		{T: TSend, Rid: "6b", Conv: "c1", Cmid: "m-2", Body: []byte{}, MentionAll: true},
		{T: TSend, Conv: "c1", Cmid: "m-3", Body: make([]byte, 70000)},
		{T: TSync, Rid: "7", Conv: "c1", Has: FAfter},
		{T: TSync, Rid: "8", Conv: "c1", After: 1 << 40, Limit: 1000},
		{T: TAck, Conv: "c1", Seq: 0},
		{T: TAck, Rid: "9", Conv: "c1", Seq: 300},
		{T: TRead, Rid: "10", Conv: "c1", Seq: 70000},
		{T: TConvs, Rid: "11"},
		{T: TConvs, Rid: "12", Limit: 50, Cursor: "opaque"},
		{T: TSnapshot, Rid: "13", Convs: []ConvAfter{{Conv: "a", After: 0}, {Conv: "b", After: 1 << 33}}},
		{T: TSnapshot, Rid: "13b", Convs: []ConvAfter{}},
		{T: TRecall, Rid: "14", Conv: "c1", Seq: 12},
		{T: TRole, Rid: "15", Conv: "g1", User: "bob", Role: RoleAdmin},
		{T: TMembersRemove, Rid: "16", Conv: "g1", Users: []string{"bob", "cy"}},
		{T: TMemberMute, Rid: "17", Conv: "g1", User: "bob", MutedUntil: 1 << 41},
		{T: TMemberMute, Rid: "17b", Conv: "g1", User: "bob", Has: FMutedUntil}, // unmute: 0
		{T: TBan, Rid: "18", Conv: "g1", User: "bob"},
		{T: TUnban, Conv: "g1", User: "bob"},
		{T: TConvUpdate, Rid: "19", Conv: "g1", Title: "new", Invite: InviteAdmins},
		{T: TConvUpdate, Rid: "19b", Conv: "g1", Has: FTitle}, // the empty title
	}
}

func TestRequestRoundTrip(t *testing.T) {
	for _, q := range sampleRequests() {
		t.Run(q.T+"/"+q.Rid, func(t *testing.T) {
			buf, err := AppendFrame([]byte("junk"), &q)
			if err != nil {
				t.Fatal(err)
			}
			body, n, err := NextFrame(buf[4:], 1<<20)
			if err != nil || n != len(buf)-4 {
				t.Fatalf("NextFrame: %d %v", n, err)
			}
			got, err := DecodeRequest(body)
			if err != nil {
				t.Fatal(err)
			}
			want := q
			want.Has = q.Fields()
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got  %+v\nwant %+v", got, want)
			}
			// The body is copied out of the input.
			if len(got.Body) > 0 && &got.Body[0] == &body[len(body)-len(got.Body)] {
				t.Fatal("body aliases the input")
			}
			// msgpack.Marshal goes through EncodeMsgpack and gives the same bytes.
			mb, err := msgpack.Marshal(q)
			if err != nil || !bytes.Equal(mb, body) {
				t.Fatalf("msgpack.Marshal differs: %v", err)
			}
			var viaDecoder Request
			if err := msgpack.Unmarshal(body, &viaDecoder); err != nil || !reflect.DeepEqual(viaDecoder, want) {
				t.Fatalf("msgpack.Unmarshal: %v %+v", err, viaDecoder)
			}
		})
	}
}

func TestRequestEncodingFields(t *testing.T) {
	keys := func(q Request) string {
		b, err := Marshal(&q)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := msgpack.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		// sort for a stable comparison
		for i := range ks {
			for j := i + 1; j < len(ks); j++ {
				if ks[j] < ks[i] {
					ks[i], ks[j] = ks[j], ks[i]
				}
			}
		}
		return strings.Join(ks, ",")
	}
	for _, tc := range []struct {
		q    Request
		want string
	}{
		{Request{T: TSync, Conv: "c", Seq: 5}, "after,conv,t"}, // after always, seq not the type's
		{Request{T: TAck, Conv: "c"}, "conv,seq,t"},            // seq always
		{Request{T: TRecall, Rid: "r", Conv: "c"}, "conv,rid,seq,t"},
		{Request{T: TRead, Conv: "c", Seq: 1, Body: []byte("x")}, "conv,seq,t"},
		{Request{T: TSend, Conv: "c", Cmid: "m"}, "body,cmid,conv,t"}, // body always, as bin
		{Request{T: TPing, Conv: "c"}, "t"},
		{Request{T: TConvs, Has: FLimit}, "limit,t"},
		{Request{T: TSnapshot}, "convs,t"},
		{Request{T: "bogus", Conv: "c", Seq: 3}, "conv,seq,t"}, // unknown type: every set field
	} {
		if got := keys(tc.q); got != tc.want {
			t.Errorf("%+v: keys %s, want %s", tc.q, got, tc.want)
		}
	}
	// body is bin even when nil
	b, _ := Marshal(&Request{T: TSend, Conv: "c", Cmid: "m"})
	if !bytes.Contains(b, []byte("\xa4body\xc4\x00")) {
		t.Fatalf("nil body not encoded as empty bin: %x", b)
	}
}

// mp encodes a value with vmihailenco/msgpack (for building test inputs).
func mp(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// raw msgpack pieces
func fixstr(s string) []byte { return append([]byte{0xa0 | byte(len(s))}, s...) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func nested(depth int) []byte {
	// {"t":"ping","x":[[[[...]]]]}
	b := cat([]byte{0x82}, fixstr("t"), fixstr("ping"), fixstr("x"))
	b = append(b, bytes.Repeat([]byte{0x91}, depth)...)
	return append(b, 0xc0)
}

func TestDecodeRequestBad(t *testing.T) {
	type M = map[string]any
	huge := func(hdr ...byte) []byte {
		return cat([]byte{0x82}, fixstr("t"), fixstr("send"), fixstr("body"), hdr)
	}
	for _, tc := range []struct {
		name    string
		in      []byte
		code    Code
		t, rid  string // expected T and Rid on the returned Request
		msgPart string
	}{
		{"empty input", nil, BadFrame, "", "", ""},
		{"empty map", []byte{0x80}, BadFrame, "", "", "t: missing"},
		{"array", mp(t, []any{"t", "ping"}), BadFrame, "", "", "not a map"},
		{"int", []byte{0x05}, BadFrame, "", "", "not a map"},
		{"string", fixstr("ping"), BadFrame, "", "", "not a map"},
		{"never-used byte", []byte{0xc1}, BadFrame, "", "", ""},
		{"t missing", mp(t, M{"rid": "r1", "conv": "c"}), BadFrame, "", "r1", "t: missing"},
		{"t int", mp(t, M{"t": 5, "rid": "r1"}), BadFrame, "", "r1", "t: not a string"},
		{"t nil", mp(t, M{"t": nil}), BadFrame, "", "", "t: missing"},
		{"t unknown", mp(t, M{"t": "send_ok", "rid": "r1"}), BadFrame, "", "r1", "unknown"},
		{"t unknown beats bad field", mp(t, M{"t": "nope", "seq": "x"}), BadFrame, "", "", "unknown"},
		{"non-string key", cat([]byte{0x82}, fixstr("t"), fixstr("ping"), []byte{0x01, 0x02}), BadFrame, "", "", "key"},
		{"truncated", mp(t, M{"t": "send", "conv": "c1", "cmid": "m", "body": []byte("hello")})[:20], BadFrame, "", "", ""},
		{"truncated header", []byte{0xde, 0x00}, BadFrame, "", "", ""},
		{"trailing bytes", append(mp(t, M{"t": "ping"}), 0xc0), BadFrame, "", "", "trailing"},
		{"map claims 4e9", []byte{0xdf, 0xee, 0x6b, 0x28, 0x00, 0xa1, 't'}, BadFrame, "", "", ""},
		{"map claims 2^32-1", []byte{0xdf, 0xff, 0xff, 0xff, 0xff}, BadFrame, "", "", ""},
		{"bin32 claims 4GB", huge(0xc6, 0xff, 0xff, 0xff, 0xff, 1, 2, 3), BadFrame, "", "", ""},
		{"str32 claims 4GB", huge(0xdb, 0xff, 0xff, 0xff, 0xf0, 'a'), BadFrame, "", "", ""},
		{"str claims beyond input", cat([]byte{0x81}, fixstr("t"), []byte{0xd9, 200, 'p'}), BadFrame, "", "", ""},
		{"array32 claims 4e9 in unknown key", cat([]byte{0x82}, fixstr("t"), fixstr("ping"), fixstr("zz"), []byte{0xdd, 0xee, 0x6b, 0x28, 0x00, 0xc0}), BadFrame, "", "", ""},
		{"members array claims 4e9", cat([]byte{0x83}, fixstr("t"), fixstr("conv_create"), fixstr("kind"), fixstr("group"), fixstr("members"), []byte{0xdd, 0xee, 0x6b, 0x28, 0x00, 0xa1, 'a'}), BadFrame, "", "", ""},
		{"ext claims beyond input", cat([]byte{0x82}, fixstr("t"), fixstr("ping"), fixstr("e"), []byte{0xc9, 0xff, 0xff, 0xff, 0xff, 1}), BadFrame, "", "", ""},
		{"deep nesting", nested(100), BadFrame, "", "", "deep"},
		{"deep maps", cat([]byte{0x82}, fixstr("t"), fixstr("ping"), fixstr("x"), bytes.Repeat(cat([]byte{0x81}, fixstr("k")), 40), []byte{0xc0}), BadFrame, "", "", "deep"},

		{"seq as string", mp(t, M{"t": "ack", "rid": "r2", "conv": "c", "seq": "5"}), BadRequest, TAck, "r2", "seq"},
		{"seq float", mp(t, M{"t": "ack", "rid": "r2", "conv": "c", "seq": 1.5}), BadRequest, TAck, "r2", "seq"},
		{"seq uint64 max", mp(t, M{"t": "ack", "rid": "r2", "conv": "c", "seq": uint64(1 << 63)}), BadRequest, TAck, "r2", "seq"},
		{"negative seq", mp(t, M{"t": "read", "rid": "r3", "conv": "c", "seq": -1}), BadRequest, TRead, "r3", "seq"},
		{"negative after", mp(t, M{"t": "sync", "rid": "r3", "conv": "c", "after": int64(-1 << 40)}), BadRequest, TSync, "r3", "after"},
		{"negative limit", mp(t, M{"t": "convs", "rid": "r3", "limit": -5}), BadRequest, TConvs, "r3", "limit"},
		{"members as map", mp(t, M{"t": "conv_create", "rid": "r4", "kind": "group", "members": M{"a": 1}}), BadRequest, TConvCreate, "r4", "members"},
		{"members with int", mp(t, M{"t": "conv_create", "rid": "r4", "kind": "group", "members": []any{"a", 1}}), BadRequest, TConvCreate, "r4", "members[1]"},
		{"body as int", mp(t, M{"t": "send", "rid": "r5", "conv": "c", "cmid": "m", "body": 7}), BadRequest, TSend, "r5", "body"},
		{"rid as int", mp(t, M{"t": "ping", "rid": 7}), BadRequest, TPing, "", "rid"},
		{"mention_all as int", mp(t, M{"t": "send", "rid": "r", "conv": "c", "cmid": "m", "body": []byte{}, "mention_all": 1}), BadRequest, TSend, "r", "mention_all"},
		{"auth without token", mp(t, M{"t": "auth", "rid": "r6", "device": "d"}), BadRequest, TAuth, "r6", "token"},
		{"auth without device", mp(t, M{"t": "auth", "rid": "r6", "token": "x"}), BadRequest, TAuth, "r6", "device"},
		{"auth with jwt and token", mp(t, M{"t": "auth", "rid": "r6", "jwt": "a.b.c", "device": "d", "token": "x"}), BadRequest, TAuth, "r6", "jwt"},
		{"auth with empty jwt", mp(t, M{"t": "auth", "rid": "r6", "jwt": ""}), BadRequest, TAuth, "r6", "jwt"},
		{"auth with jwt as bin", mp(t, M{"t": "auth", "rid": "r6", "jwt": []byte("a.b.c")}), BadRequest, TAuth, "r6", "jwt"},
		{"auth without anything", mp(t, M{"t": "auth", "rid": "r6"}), BadRequest, TAuth, "r6", "device"},
		{"refresh without jwt", mp(t, M{"t": "refresh", "rid": "r6"}), BadRequest, TRefresh, "r6", "jwt"},
		{"refresh with jwt as int", mp(t, M{"t": "refresh", "rid": "r6", "jwt": 5}), BadRequest, TRefresh, "r6", "jwt"},
		{"conv_create bad kind", mp(t, M{"t": "conv_create", "rid": "r7", "kind": "channel", "members": []string{}}), BadRequest, TConvCreate, "r7", "kind"},
		{"role unknown", mp(t, M{"t": "role", "rid": "m1", "conv": "g", "user": "u", "role": "king"}), BadRequest, TRole, "m1", "role"},
		{"role without role", mp(t, M{"t": "role", "rid": "m1", "conv": "g", "user": "u"}), BadRequest, TRole, "m1", "role"},
		{"role empty user", mp(t, M{"t": "role", "rid": "m1", "conv": "g", "user": "", "role": "admin"}), BadRequest, TRole, "m1", "user"},
		{"ban without user", mp(t, M{"t": "ban", "rid": "m2", "conv": "g"}), BadRequest, TBan, "m2", "user"},
		{"member_mute without muted_until", mp(t, M{"t": "member_mute", "rid": "m3", "conv": "g", "user": "u"}), BadRequest, TMemberMute, "m3", "muted_until"},
		{"member_mute negative", mp(t, M{"t": "member_mute", "rid": "m3", "conv": "g", "user": "u", "muted_until": -1}), BadRequest, TMemberMute, "m3", "muted_until"},
		{"members_remove without users", mp(t, M{"t": "members_remove", "rid": "m4", "conv": "g"}), BadRequest, TMembersRemove, "m4", "users"},
		{"conv_update without changes", mp(t, M{"t": "conv_update", "rid": "m5", "conv": "g"}), BadRequest, TConvUpdate, "m5", "title or invite"},
		{"conv_update bad invite", mp(t, M{"t": "conv_update", "rid": "m5", "conv": "g", "invite": "nobody"}), BadRequest, TConvUpdate, "m5", "invite"},
		{"unban empty conv", mp(t, M{"t": "unban", "rid": "m6", "conv": "", "user": "u"}), BadRequest, TUnban, "m6", "conv"},
		{"conv_create no members", mp(t, M{"t": "conv_create", "rid": "r7", "kind": "group"}), BadRequest, TConvCreate, "r7", "members"},
		{"members_add no users", mp(t, M{"t": "members_add", "rid": "r8", "conv": "c"}), BadRequest, TMembersAdd, "r8", "users"},
		{"leave no conv", mp(t, M{"t": "leave", "rid": "r9"}), BadRequest, TLeave, "r9", "conv"},
		{"leave empty conv", mp(t, M{"t": "leave", "rid": "r9", "conv": ""}), BadRequest, TLeave, "r9", "conv"},
		{"send no body", mp(t, M{"t": "send", "rid": "r10", "conv": "c", "cmid": "m"}), BadRequest, TSend, "r10", "body"},
		{"send nil body", mp(t, M{"t": "send", "rid": "r10", "conv": "c", "cmid": "m", "body": nil}), BadRequest, TSend, "r10", "body"},
		{"send no cmid", mp(t, M{"t": "send", "rid": "r10", "conv": "c", "body": []byte("x")}), BadRequest, TSend, "r10", "cmid"},
		{"sync no conv", mp(t, M{"t": "sync", "rid": "r11", "after": 0}), BadRequest, TSync, "r11", "conv"},
		{"sync no after", mp(t, M{"t": "sync", "rid": "r11", "conv": "c"}), BadRequest, TSync, "r11", "after"},
		{"sync nil after", mp(t, M{"t": "sync", "rid": "r11", "conv": "c", "after": nil}), BadRequest, TSync, "r11", "after"},
		{"ack no seq", mp(t, M{"t": "ack", "conv": "c"}), BadRequest, TAck, "", "seq"},
		{"recall no seq", mp(t, M{"t": "recall", "rid": "r12", "conv": "c"}), BadRequest, TRecall, "r12", "seq"},
		{"snapshot no convs", mp(t, M{"t": "snapshot", "rid": "r13"}), BadRequest, TSnapshot, "r13", "convs"},
		{"snapshot convs element not a map", mp(t, M{"t": "snapshot", "rid": "r13", "convs": []any{"c"}}), BadRequest, TSnapshot, "r13", "convs[0]"},
		{"snapshot element without conv", mp(t, M{"t": "snapshot", "rid": "r13", "convs": []any{M{"after": 3}}}), BadRequest, TSnapshot, "r13", "convs[0].conv"},
		{"snapshot element without after", mp(t, M{"t": "snapshot", "rid": "r13", "convs": []any{M{"conv": "c", "after": 1}, M{"conv": "d"}}}), BadRequest, TSnapshot, "r13", "convs[1].after"},
		{"snapshot negative after", mp(t, M{"t": "snapshot", "rid": "r13", "convs": []any{M{"conv": "c", "after": -3}}}), BadRequest, TSnapshot, "r13", "convs[0].after"},
		{"snapshot after as string", mp(t, M{"t": "snapshot", "rid": "r13", "convs": []any{M{"conv": "c", "after": "3"}}}), BadRequest, TSnapshot, "r13", "convs[0].after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := DecodeRequest(tc.in)
			wantCode(t, err, tc.code)
			if !strings.Contains(err.Error(), tc.msgPart) {
				t.Errorf("msg %q does not mention %q", err.Error(), tc.msgPart)
			}
			if q.T != tc.t || q.Rid != tc.rid {
				t.Errorf("T=%q Rid=%q, want %q %q", q.T, q.Rid, tc.t, tc.rid)
			}
		})
	}
}

// TestDecodeRequestRequiredFields: every field a request type does not
// mark optional (docs/protocol.md §2 and §4) is required; a request
// without it is BAD_REQUEST naming it, with rid echoed.
func TestDecodeRequestRequiredFields(t *testing.T) {
	type M = map[string]any
	for typ, full := range map[string]M{
		TAuth:       {"device": "d", "token": "x"},
		TConvCreate: {"kind": "group", "members": []string{"b"}},
		TMembersAdd: {"conv": "c", "users": []string{"b"}},
		TLeave:      {"conv": "c"},
		TSend:       {"conv": "c", "cmid": "m", "body": []byte("x")},
		TSync:       {"conv": "c", "after": 0},
		TAck:        {"conv": "c", "seq": 1},
		TRead:       {"conv": "c", "seq": 1},
		TRecall:     {"conv": "c", "seq": 1},
		TSnapshot:   {"convs": []any{M{"conv": "c", "after": 0}}},
		TRefresh:    {"jwt": "a.b.c"},
	} {
		with := M{"t": typ, "rid": "r"}
		for k, v := range full {
			with[k] = v
		}
		if _, err := DecodeRequest(mp(t, with)); err != nil {
			t.Fatalf("%s with every required field: %v", typ, err)
		}
		for field := range full {
			without := M{}
			for k, v := range with {
				if k != field {
					without[k] = v
				}
			}
			q, err := DecodeRequest(mp(t, without))
			if e, ok := AsError(err); !ok || e.Code != BadRequest || !strings.Contains(e.Msg, field) || q.Rid != "r" {
				t.Errorf("%s without %s: %v (rid %q), want BAD_REQUEST naming it", typ, field, err, q.Rid)
			}
		}
	}
}

func TestDecodeRequestLenient(t *testing.T) {
	type M = map[string]any
	// every int width, str body, unknown keys with nested garbage, nil = absent
	for _, seq := range []any{int8(5), int16(5), int32(5), int64(5), uint8(5), uint16(5), uint32(5), uint64(5), 5} {
		in := mp(t, M{"t": "ack", "conv": "c", "seq": seq})
		q, err := DecodeRequest(in)
		if err != nil || q.Seq != 5 {
			t.Fatalf("%T: %v %d", seq, err, q.Seq)
		}
	}
	for _, seq := range []int64{0, 127, 128, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, 1<<63 - 1} {
		for _, in := range [][]byte{
			mp(t, M{"t": "ack", "conv": "c", "seq": seq}),
			mp(t, M{"t": "ack", "conv": "c", "seq": uint64(seq)}),
			(&Request{T: TAck, Conv: "c", Seq: seq}).appendMsgpack(nil),
		} {
			q, err := DecodeRequest(in)
			if err != nil || q.Seq != seq {
				t.Fatalf("%d: %v %d", seq, err, q.Seq)
			}
		}
	}
	in := mp(t, M{
		"t": "send", "conv": "c", "cmid": "m", "body": "as a string",
		"rid": nil, "x": M{"a": []any{1, 2.5, float32(3), true, nil, M{"b": []byte{1}}}},
		"y": msgpack.RawMessage{0xd4, 1, 2}, "title": nil,
	})
	q, err := DecodeRequest(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(q.Body) != "as a string" || q.Has != FConv|FCmid|FBody {
		t.Fatalf("%+v", q)
	}
	// nesting just inside the bound is fine
	if _, err := DecodeRequest(nested(maxDepth - 2)); err != nil {
		t.Fatalf("nesting %d: %v", maxDepth-2, err)
	}
}

// TestDecodeRequestHugeClaims checks that claimed sizes are never allocated.
func TestDecodeRequestHugeClaims(t *testing.T) {
	inputs := [][]byte{
		{0xdf, 0xee, 0x6b, 0x28, 0x00},
		{0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 't', 0xa4, 'p', 'i', 'n', 'g'},
		cat([]byte{0x82}, fixstr("t"), fixstr("send"), fixstr("body"), []byte{0xc6, 0xff, 0xff, 0xff, 0xff, 1}),
		cat([]byte{0x82}, fixstr("t"), fixstr("send"), fixstr("body"), []byte{0xdb, 0xff, 0xff, 0xff, 0xff, 1}),
		cat([]byte{0x82}, fixstr("t"), fixstr("conv_create"), fixstr("members"), []byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0xa0}),
		cat([]byte{0x82}, fixstr("t"), fixstr("snapshot"), fixstr("convs"), []byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0x80}),
	}
	for i, in := range inputs {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range 100 {
			if _, err := DecodeRequest(in); err == nil {
				t.Fatalf("input %d decoded", i)
			}
		}
		runtime.ReadMemStats(&after)
		if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
			t.Errorf("input %d: 100 decodes allocated %d bytes", i, d)
		}
		allocs := testing.AllocsPerRun(100, func() { _, _ = DecodeRequest(in) })
		if allocs > 3 {
			t.Errorf("input %d: %.0f allocs per decode", i, allocs)
		}
	}
}

func TestDecodeRequestAllocs(t *testing.T) {
	q := Request{T: TSend, Rid: "r1", Conv: "conv-1", Cmid: "cmid-1", Body: make([]byte, 100)}
	b, _ := Marshal(&q)
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := DecodeRequest(b); err != nil {
			t.Fatal(err)
		}
	})
	// rid, conv, cmid, body
	if allocs > 4 {
		t.Errorf("send: %.0f allocs per decode, want <= 4", allocs)
	}
	ping := []byte{0x81, 0xa1, 't', 0xa4, 'p', 'i', 'n', 'g'}
	if allocs := testing.AllocsPerRun(1000, func() { _, _ = DecodeRequest(ping) }); allocs != 0 {
		t.Errorf("ping: %.0f allocs", allocs)
	}
}

func TestFieldString(t *testing.T) {
	if s := (FRid | FSeq | FMentionAll).String(); s != "rid|seq|mention_all" {
		t.Fatal(s)
	}
}

// TestDecodeRequestIntegersAsFloats: wherever a request has an integer
// field, a float32 or float64 that holds an exact integer (JavaScript's
// msgpack encoders write large numbers such as Unix milliseconds as
// float64) is that integer; any other float (a fraction, NaN, an
// infinity, a negative value, one beyond int64) is BAD_REQUEST naming the
// field, with rid echoed, as before (docs/protocol.md §1). Every integer
// field of every request type is in the table: a request type or an int64
// field of Request that it misses fails the test.
func TestDecodeRequestIntegersAsFloats(t *testing.T) {
	type M = map[string]any
	rows := []struct {
		typ, field string
		base       M // the request's other required fields
	}{
		{TSync, "after", M{"conv": "c"}},
		{TSync, "limit", M{"conv": "c", "after": 0}},
		{TConvs, "limit", M{}},
		{TAck, "seq", M{"conv": "c"}},
		{TRead, "seq", M{"conv": "c"}},
		{TRecall, "seq", M{"conv": "c"}},
		{TClear, "seq", M{"conv": "c"}},
		{TEdit, "seq", M{"conv": "c", "body": []byte("x")}},
		{TConvSettings, "muted_until", M{"conv": "c"}},
		{TMemberMute, "muted_until", M{"conv": "c", "user": "u"}},
		{TSnapshot, "convs[].after", M{}},
	}
	// Completeness: every int64 field of Request, in every request type
	// that has it, has a row (and snapshot's convs[].after, above).
	intFields := map[string]Field{}
	rt := reflect.TypeOf(Request{})
	for i := range rt.NumField() {
		if rt.Field(i).Type.Kind() != reflect.Int64 {
			continue
		}
		f, ok := map[string]Field{"Seq": FSeq, "After": FAfter, "Limit": FLimit, "MutedUntil": FMutedUntil}[rt.Field(i).Name]
		if !ok {
			t.Fatalf("Request.%s is an integer field this test does not know", rt.Field(i).Name)
		}
		intFields[fieldName(f)] = f
	}
	for _, typ := range []string{TAuth, TRefresh, TPing, TConvCreate, TMembersAdd, TLeave, TSend, TSync, TAck, TRead,
		TRecall, TEdit, TClear, TTyping, TReceipts, TSettings, TConvs, TSnapshot, TNotifyRegister, TNotifyUnregister,
		TConvSettings, TRole, TMembersRemove, TMemberMute, TBan, TUnban, TConvUpdate} {
		spec, ok := specOf(typ)
		if !ok || requestType([]byte(typ)) != typ {
			t.Fatalf("%s is not a request type", typ)
		}
		for name, f := range intFields {
			if (spec.req|spec.opt)&f == 0 {
				continue
			}
			if !slices.ContainsFunc(rows, func(r struct {
				typ, field string
				base       M
			}) bool {
				return r.typ == typ && r.field == name
			}) {
				t.Errorf("no row for %s.%s", typ, name)
			}
		}
	}

	frame := func(typ, field string, base M, v any) []byte {
		m := M{"t": typ, "rid": "r"}
		for k, x := range base {
			m[k] = x
		}
		if field == "convs[].after" {
			m["convs"] = []any{M{"conv": "c", "after": v}}
		} else {
			m[field] = v
		}
		return mp(t, m)
	}
	value := func(q Request, field string) int64 {
		switch field {
		case "seq":
			return q.Seq
		case "after":
			return q.After
		case "limit":
			return q.Limit
		case "muted_until":
			return q.MutedUntil
		case "convs[].after":
			return q.Convs[0].After
		}
		t.Fatalf("unknown field %s", field)
		return 0
	}
	accepted := []struct {
		v    any
		want int64
	}{
		{0.0, 0}, {math.Copysign(0, -1), 0}, {7.0, 7}, {1717400000123.0, 1717400000123},
		{float64(1 << 53), 1 << 53}, {float64(1<<53 + 2), 1<<53 + 2}, {float64(1 << 62), 1 << 62},
		{float64(1<<63 - 1024), 1<<63 - 1024}, // the largest float64 below 2^63
		{float32(0), 0}, {float32(3), 3}, {float32(1 << 24), 1 << 24}, {float32(1 << 40), 1 << 40},
	}
	refused := []any{
		1.5, 0.5, -0.5, 1717400000123.5, math.NaN(), math.Inf(1), math.Inf(-1), -1.0, -1717400000123.0,
		float64(1 << 63), 1e300, -1e300, math.MaxFloat64, math.SmallestNonzeroFloat64,
		float32(2.5), float32(math.NaN()), float32(math.Inf(1)), float32(-3), float32(1 << 63),
	}
	for _, r := range rows {
		for _, a := range accepted {
			if b := mp(t, a.v); b[0] != 0xca && b[0] != 0xcb {
				t.Fatalf("%T %v is not encoded as a float: % x", a.v, a.v, b)
			}
			q, err := DecodeRequest(frame(r.typ, r.field, r.base, a.v))
			if err != nil || value(q, r.field) != a.want || q.Rid != "r" {
				t.Errorf("%s.%s = %T %v: %+v %v; want %d", r.typ, r.field, a.v, a.v, q, err, a.want)
			}
		}
		for _, v := range refused {
			q, err := DecodeRequest(frame(r.typ, r.field, r.base, v))
			e, ok := AsError(err)
			name := strings.TrimSuffix(r.field, "[].after")
			if !ok || e.Code != BadRequest || !strings.Contains(e.Msg, name) || q.T != r.typ || q.Rid != "r" {
				t.Errorf("%s.%s = %T %v: %v (T %q, rid %q); want BAD_REQUEST naming the field", r.typ, r.field, v, v, err, q.T, q.Rid)
			}
		}
	}
	// A float cut short is a truncated frame.
	for _, tail := range [][]byte{{0xcb, 0x42}, {0xca, 0x40, 0x40}, {0xcb}} {
		in := cat([]byte{0x83}, fixstr("t"), fixstr("ack"), fixstr("conv"), fixstr("c"), fixstr("seq"), tail)
		_, err := DecodeRequest(in)
		wantCode(t, err, BadFrame)
	}
}
