package wire

import (
	"bytes"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// replyTypes is one zero value of every server→client frame type, with the
// frame name its T defaults to.
var replyTypes = []struct {
	v any
	t string
}{
	{AuthOK{}, TAuthOK}, {Pong{}, TPong}, {ConvCreateOK{}, TConvCreateOK},
	{MembersOK{}, TMembersOK}, {SendOK{}, TSendOK}, {SyncOK{}, TSyncOK},
	{AckOK{}, TAckOK}, {ReadOK{}, TReadOK}, {ConvsOK{}, TConvsOK},
	{SnapshotOK{}, TSnapshotOK}, {RecallOK{}, TRecallOK}, {Push{}, TPush},
	{Hint{}, THint}, {ReadChanged{}, TReadChanged}, {Kick{}, TKick},
	{ErrorFrame{}, TError}, {RefreshOK{}, TRefreshOK}, {UpdateOK{}, TUpdateOK},
}

// fill sets every field of the struct v points to to a non-zero value.
func fill(v reflect.Value, seed int) {
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		name := v.Type().Field(i).Name
		if v.Type().Field(i).Anonymous {
			fill(f, seed)
			continue
		}
		if f.Kind() == reflect.Pointer {
			f.Set(reflect.New(f.Type().Elem()))
			f = f.Elem()
		}
		switch f.Kind() {
		case reflect.String:
			f.SetString(strings.ToLower(name) + "-" + string(rune('a'+seed)))
		case reflect.Int64:
			f.SetInt(int64(1000*seed + 300 + i))
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Slice:
			switch f.Type().Elem().Kind() {
			case reflect.Uint8:
				f.SetBytes(bytes.Repeat([]byte{byte(seed + 1)}, 40))
			case reflect.String:
				f.Set(reflect.ValueOf([]string{"u1", "u2"}))
			case reflect.Struct:
				s := reflect.MakeSlice(f.Type(), 2, 2)
				fill(s.Index(0), seed+1)
				fill(s.Index(1), seed+2)
				f.Set(s)
			}
		}
	}
}

// tagKeys returns the wire names of struct type typ: all, and those without
// omitempty.
func tagKeys(typ reflect.Type) (all, required []string) {
	for i := 0; i < typ.NumField(); i++ {
		if typ.Field(i).Anonymous { // inlined: its keys are typ's
			a, r := tagKeys(typ.Field(i).Type)
			all, required = append(all, a...), append(required, r...)
			continue
		}
		tag := typ.Field(i).Tag.Get("msgpack")
		name, opts, _ := strings.Cut(tag, ",")
		all = append(all, name)
		if !strings.Contains(opts, "omitempty") {
			required = append(required, name)
		}
	}
	sort.Strings(all)
	sort.Strings(required)
	return
}

func mapKeys(t *testing.T, body []byte) []string {
	t.Helper()
	var m map[string]any
	if err := msgpack.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// TestReplyTags checks the hand-written encoders against the struct tags:
// a fully set value writes every tagged key, a zero value exactly the keys
// without omitempty, and decoding by the tags (reflection) gives the value
// back.
func TestReplyTags(t *testing.T) {
	types := append([]any{}, Event{}, ConvItem{}, SnapshotItem{}, ConvAfter{})
	for _, rt := range replyTypes {
		types = append(types, rt.v)
	}
	for _, zero := range types {
		typ := reflect.TypeOf(zero)
		t.Run(typ.Name(), func(t *testing.T) {
			all, required := tagKeys(typ)
			full := reflect.New(typ)
			fill(full.Elem(), 0)
			body, err := Marshal(full.Interface())
			if err != nil {
				t.Fatal(err)
			}
			if got := mapKeys(t, body); !reflect.DeepEqual(got, all) {
				t.Errorf("full value: keys %v, want %v", got, all)
			}
			back := reflect.New(typ)
			if err := msgpack.Unmarshal(body, back.Interface()); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back.Elem().Interface(), full.Elem().Interface()) {
				t.Errorf("decoded by tags:\n got %+v\nwant %+v", back.Elem().Interface(), full.Elem().Interface())
			}
			// msgpack.Marshal (through EncodeMsgpack) gives the same bytes,
			// by value and by pointer, and inside another value.
			for _, v := range []any{full.Interface(), full.Elem().Interface()} {
				mb, err := msgpack.Marshal(v)
				if err != nil || !bytes.Equal(mb, body) {
					t.Errorf("msgpack.Marshal(%T) differs: %v", v, err)
				}
			}
			var nest struct{ X []any }
			nest.X = []any{full.Elem().Interface()}
			if _, err := msgpack.Marshal(&nest); err != nil {
				t.Error(err)
			}

			zb, err := Marshal(reflect.New(typ).Interface())
			if err != nil {
				t.Fatal(err)
			}
			if got := mapKeys(t, zb); !reflect.DeepEqual(got, required) {
				t.Errorf("zero value: keys %v, want %v", got, required)
			}
		})
	}
}

// TestReplyRoundTrip encodes every reply with AppendFrame and decodes it
// with NextFrame + DecodeMessage; DecodeMessage must agree with decoding the
// same bytes into Message by its tags.
func TestReplyRoundTrip(t *testing.T) {
	for _, rt := range replyTypes {
		typ := reflect.TypeOf(rt.v)
		for _, mode := range []string{"full", "zero"} {
			t.Run(typ.Name()+"/"+mode, func(t *testing.T) {
				v := reflect.New(typ)
				if mode == "full" {
					fill(v.Elem(), 0)
					v.Elem().FieldByName("T").SetString(rt.t)
				}
				buf, err := AppendFrame(nil, v.Interface())
				if err != nil {
					t.Fatal(err)
				}
				body, n, err := NextFrame(buf, DefaultMaxFrame)
				if err != nil || n != len(buf) {
					t.Fatalf("NextFrame %d/%d %v", n, len(buf), err)
				}
				m, err := DecodeMessage(body)
				if err != nil {
					t.Fatal(err)
				}
				if m.T != rt.t {
					t.Fatalf("T = %q, want %q", m.T, rt.t)
				}
				var viaTags Message
				if err := msgpack.Unmarshal(body, &viaTags); err != nil {
					t.Fatal(err)
				}
				normalize(&m)
				normalize(&viaTags)
				if !reflect.DeepEqual(m, viaTags) {
					t.Fatalf("DecodeMessage:\n%+v\nmsgpack.Unmarshal:\n%+v", m, viaTags)
				}
				// every field of the reply shows up in the Message (T was
				// defaulted by the encoder in zero mode)
				v.Elem().FieldByName("T").SetString(rt.t)
				checkFields(t, v.Elem(), reflect.ValueOf(m))
			})
		}
	}
}

// normalize turns empty slices into nil, so the two decoders compare equal.
func normalize(m *Message) {
	if len(m.Events) == 0 {
		m.Events = nil
	}
	if len(m.Items) == 0 {
		m.Items = nil
	}
	for i := range m.Items {
		if len(m.Items[i].Events) == 0 {
			m.Items[i].Events = nil
		}
	}
	for _, evs := range [][]Event{m.Events} {
		for i := range evs {
			if len(evs[i].Body) == 0 {
				evs[i].Body = nil
			}
		}
	}
	for i := range m.Items {
		for j := range m.Items[i].Events {
			if len(m.Items[i].Events[j].Body) == 0 {
				m.Items[i].Events[j].Body = nil
			}
		}
	}
	if len(m.Body) == 0 {
		m.Body = nil
	}
}

// checkFields checks that each field of reply src has the same value in the
// Message m (matched by wire name). Items are compared field by field.
func checkFields(t *testing.T, src, m reflect.Value) {
	t.Helper()
	byTag := map[string]reflect.Value{}
	for _, f := range taggedFields(m) {
		byTag[f.name] = f.v
	}
	for _, f := range taggedFields(src) {
		name := f.name
		want, got := f.v, byTag[name]
		if !got.IsValid() {
			t.Errorf("field %s missing from Message", name)
			continue
		}
		if want.Kind() == reflect.Slice && want.Len() == 0 && got.Len() == 0 {
			continue
		}
		if name == "items" {
			if want.Len() != got.Len() {
				t.Errorf("items: %d, want %d", got.Len(), want.Len())
				continue
			}
			for j := 0; j < want.Len(); j++ {
				checkFields(t, want.Index(j), got.Index(j))
			}
			continue
		}
		if !reflect.DeepEqual(got.Interface(), want.Interface()) {
			t.Errorf("%s: got %v, want %v", name, got.Interface(), want.Interface())
		}
	}
}

func TestReplyEncodingDetails(t *testing.T) {
	// nil body is an empty bin, not nil
	for _, v := range []any{&Push{Conv: "c"}, &Event{Kind: KindJoin}} {
		b, _ := Marshal(v)
		if !bytes.Contains(b, []byte("\xa4body\xc4\x00")) {
			t.Errorf("%T: nil body not encoded as empty bin: %x", v, b)
		}
	}
	// sync_ok always has more and events (an empty array)
	b, _ := Marshal(&SyncOK{Rid: "r"})
	if !bytes.Contains(b, []byte("\xa4more\xc2")) || !bytes.Contains(b, []byte("\xa6events\x90")) {
		t.Errorf("sync_ok: %x", b)
	}
	// compact ints
	b, _ = Marshal(&Hint{Conv: "c", Head: 5})
	if !bytes.HasSuffix(b, []byte("\xa4head\x05")) {
		t.Errorf("hint: %x", b)
	}
	// T defaults to the frame name, an explicit T wins
	m, _ := DecodeMessage(mustMarshal(t, Kick{Reason: KickReplaced}))
	if m.T != TKick || m.Reason != "replaced" {
		t.Errorf("%+v", m)
	}
	// negative ints round-trip (not produced by the server, but encodable)
	for _, v := range []int64{-1, -32, -33, -128, -129, -32768, -32769, -1 << 31, -1<<31 - 1, -1 << 63} {
		m, err := DecodeMessage(mustMarshal(t, &Hint{Head: v}))
		if err != nil || m.Head != v {
			t.Errorf("%d: %d %v", v, m.Head, err)
		}
		var h Hint
		if err := msgpack.Unmarshal(mustMarshal(t, &Hint{Head: v}), &h); err != nil || h.Head != v {
			t.Errorf("%d via msgpack: %d %v", v, h.Head, err)
		}
	}
	// error frames
	ef := ErrorReply("r9", &Error{Code: RateLimited, Msg: "slow", RetryAfterMs: 1500})
	m, err := DecodeMessage(mustMarshal(t, &ef))
	if err != nil || m.Err() == nil || m.Err().Code != RateLimited || m.Err().RetryAfterMs != 1500 || m.Rid != "r9" {
		t.Fatalf("%+v %v", m, err)
	}
	// push <-> event
	ev := Event{Seq: 3, Kind: KindMsg, Sender: "al", Body: []byte("hi"), Ts: 99, Cmid: "c1"}
	p := PushOf("conv", &ev)
	m, _ = DecodeMessage(mustMarshal(t, &p))
	if got := m.Event(); !reflect.DeepEqual(got, ev) || m.Conv != "conv" || m.T != TPush {
		t.Fatalf("%+v", got)
	}
	if got := p.Event(); !reflect.DeepEqual(got, ev) {
		t.Fatalf("%+v", got)
	}
	// items views
	cs := ConvsOK{Items: []ConvItem{{Conv: "a", Kind: "group", Mode: ModePush, Head: 4, LastTs: 8}}, More: true, Cursor: "x"}
	m, _ = DecodeMessage(mustMarshal(t, &cs))
	if len(m.Items) != 1 || m.Items[0].ConvItem() != cs.Items[0] || !m.More || m.Cursor != "x" {
		t.Fatalf("%+v", m)
	}
	ss := SnapshotOK{Items: []SnapshotItem{{Conv: "a", Head: 9, Events: []Event{ev}, Skipped: 3}, {Conv: "b", Error: string(NotMember), Events: []Event{}}}}
	m, _ = DecodeMessage(mustMarshal(t, &ss))
	if len(m.Items) != 2 || !reflect.DeepEqual(m.Items[0].SnapshotItem(), ss.Items[0]) || m.Items[1].Error != "NOT_MEMBER" {
		t.Fatalf("%+v", m)
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAppendFrameFallback(t *testing.T) {
	// a value that is not one of ours goes through the pooled encoder
	buf, err := AppendFrame([]byte{1, 2}, map[string]any{"t": "x", "n": int64(5)})
	if err != nil {
		t.Fatal(err)
	}
	body, n, err := NextFrame(buf[2:], 100)
	if err != nil || n != len(buf)-2 {
		t.Fatal(n, err)
	}
	// compact ints: 5 takes one byte
	if !bytes.Contains(body, []byte("\xa1n\x05")) {
		t.Fatalf("%x", body)
	}
	// our types nested in another value are encoded straight into the
	// pooled encoder's buffer, with the same bytes
	p := &Push{Conv: "c", EventFields: Event{Seq: 7, Body: []byte("hi")}}
	buf, err = AppendFrame(nil, []any{p, "x"})
	if err != nil {
		t.Fatal(err)
	}
	if want := append([]byte{0x92}, append(mustMarshal(t, p), 0xa1, 'x')...); !bytes.Equal(buf[HeaderLen:], want) {
		t.Fatalf("nested: %x, want %x", buf[HeaderLen:], want)
	}
	// an unencodable value leaves dst unchanged
	out, err := AppendFrame([]byte{1, 2}, make(chan int))
	if err == nil || !bytes.Equal(out, []byte{1, 2}) {
		t.Fatalf("%v %x", err, out)
	}
}

func TestDecodeMessageBad(t *testing.T) {
	for name, in := range map[string][]byte{
		"empty":           nil,
		"not a map":       {0x91, 0xc0},
		"no t":            {0x80},
		"t int":           {0x81, 0xa1, 't', 0x01},
		"seq string":      mp(t, map[string]any{"t": "push", "seq": "1"}),
		"events claims":   cat([]byte{0x82}, fixstr("t"), fixstr("sync_ok"), fixstr("events"), []byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0x80}),
		"items claims":    cat([]byte{0x82}, fixstr("t"), fixstr("convs_ok"), fixstr("items"), []byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0x80}),
		"body claims":     cat([]byte{0x82}, fixstr("t"), fixstr("push"), fixstr("body"), []byte{0xc6, 0xff, 0xff, 0xff, 0xff, 0x80}),
		"deep":            nested(100),
		"trailing":        append(mp(t, map[string]any{"t": "pong"}), 1),
		"event not a map": mp(t, map[string]any{"t": "sync_ok", "events": []any{1}}),
	} {
		if _, err := DecodeMessage(in); err == nil {
			t.Errorf("%s: decoded", name)
		} else {
			wantCode(t, err, BadFrame)
		}
	}
	// unknown keys and frame types are accepted (forward compatibility)
	m, err := DecodeMessage(mp(t, map[string]any{"t": "future", "zz": []any{1, map[string]any{"a": nil}}, "rid": nil}))
	if err != nil || m.T != "future" {
		t.Fatalf("%+v %v", m, err)
	}
}

type taggedField struct {
	name string
	v    reflect.Value
}

// taggedFields lists the fields of struct v by wire name, those of
// embedded (inlined) structs included.
func taggedFields(v reflect.Value) []taggedField {
	var out []taggedField
	for i := 0; i < v.NumField(); i++ {
		if v.Type().Field(i).Anonymous {
			out = append(out, taggedFields(v.Field(i))...)
			continue
		}
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("msgpack"), ",")
		out = append(out, taggedField{name, v.Field(i)})
	}
	return out
}

// TestEventMapOneEncoding: an event with every key set reads the same
// wherever it is carried: a push writes exactly the event map's keys and
// values beside t and conv, and the client's decoder gives back the same
// Event from a push, a sync_ok and a snapshot_ok.
func TestEventMapOneEncoding(t *testing.T) {
	var ev Event
	fill(reflect.ValueOf(&ev).Elem(), 0)
	evMap := map[string]any{}
	if err := msgpack.Unmarshal(mustMarshal(t, &ev), &evMap); err != nil {
		t.Fatal(err)
	}
	p := PushOf("conv", &ev)
	var pushMap map[string]any
	if err := msgpack.Unmarshal(mustMarshal(t, &p), &pushMap); err != nil {
		t.Fatal(err)
	}
	if pushMap["t"] != TPush || pushMap["conv"] != "conv" {
		t.Fatalf("push: %v", pushMap)
	}
	delete(pushMap, "t")
	delete(pushMap, "conv")
	if !reflect.DeepEqual(pushMap, evMap) {
		t.Fatalf("push without t and conv:\n%v\nthe event map:\n%v", pushMap, evMap)
	}
	all, _ := tagKeys(reflect.TypeOf(ev))
	if got := mapKeys(t, mustMarshal(t, &ev)); !reflect.DeepEqual(got, all) {
		t.Fatalf("the event map's keys %v, want %v", got, all)
	}

	m, err := DecodeMessage(mustMarshal(t, &p))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Event(); !reflect.DeepEqual(got, ev) {
		t.Errorf("push decoded:\n got %+v\nwant %+v", got, ev)
	}
	m, err = DecodeMessage(mustMarshal(t, &SyncOK{Events: []Event{ev}}))
	if err != nil || len(m.Events) != 1 || !reflect.DeepEqual(m.Events[0], ev) {
		t.Errorf("sync_ok decoded: %+v %v, want %+v", m.Events, err, ev)
	}
	m, err = DecodeMessage(mustMarshal(t, &SnapshotOK{Items: []SnapshotItem{{Conv: "conv", Events: []Event{ev}}}}))
	if err != nil || len(m.Items) != 1 || len(m.Items[0].Events) != 1 || !reflect.DeepEqual(m.Items[0].Events[0], ev) {
		t.Errorf("snapshot_ok decoded: %+v %v, want %+v", m.Items, err, ev)
	}
}
