package fanout

import (
	"reflect"
	"testing"

	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/wire"
)

// fullEvent is a stored event with every field set.
func fullEvent() store.Event {
	mu, banned, title := int64(1735689600999), true, "Trip"
	return store.Event{Conv: "g.0123456789abcdef01234567", Seq: 123456, Kind: store.KindMsg, Sender: "user-42",
		Cmid: "cmid-0001", Body: make([]byte, 100), Ts: 1735689600123, Recalled: true, Target: 99,
		Users: []string{"ana", "ben"}, Mentions: []string{"cy", "dee"}, Edited: 1735689600456,
		Update: store.Update{Role: "admin", MutedUntil: &mu, Banned: &banned, Title: &title, Invite: "admins"}}
}

// sameFields checks that every field of the stored value s (but Conv,
// which the frames around an event carry) has a field of the same name in
// the wire value w, with the same value (a kind as its name), and that
// every field of w is set.
func sameFields(t *testing.T, path string, s, w reflect.Value) {
	t.Helper()
	for i := 0; i < s.NumField(); i++ {
		name := s.Type().Field(i).Name
		if name == "Conv" {
			continue
		}
		wf := w.FieldByName(name)
		if !wf.IsValid() {
			t.Errorf("%s%s: no such field in wire.Event: the event map would never carry it", path, name)
			continue
		}
		sf := s.Field(i)
		switch {
		case sf.Kind() == reflect.Struct:
			sameFields(t, path+name+".", sf, wf)
		case name == "Kind":
			if got, want := wf.String(), sf.Interface().(store.Kind).String(); got != want {
				t.Errorf("%sKind: %q, want %q", path, got, want)
			}
		case !reflect.DeepEqual(wf.Interface(), sf.Interface()):
			t.Errorf("%s%s: %v, want %v", path, name, wf.Interface(), sf.Interface())
		}
	}
	for i := 0; i < w.NumField(); i++ {
		if w.Field(i).IsZero() {
			t.Errorf("%s%s: not set from the stored event", path, w.Type().Field(i).Name)
		}
	}
}

// WireEvent, the one conversion of a stored event into the event map,
// keeps every field.
func TestWireEventKeepsEveryField(t *testing.T) {
	e := fullEvent()
	w := WireEvent(&e)
	sameFields(t, "", reflect.ValueOf(e), reflect.ValueOf(w))
}

// A push frame is WireEvent's event map beside t and conv, encoded in one
// allocation (the frame that fan-out shares among the event's devices).
func TestPushFrame(t *testing.T) {
	for _, e := range []store.Event{
		{Conv: "g.0123456789abcdef01234567", Seq: 123456, Kind: store.KindMsg, Sender: "user-42", Cmid: "cmid-0001",
			Body: make([]byte, 100), Ts: 1735689600123, Mentions: []string{"ana", "ben"}},
		fullEvent(),
	} {
		frame, err := PushFrame(e)
		if err != nil {
			t.Fatal(err)
		}
		body, n, err := wire.NextFrame(frame, wire.DefaultMaxFrame)
		if err != nil || n != len(frame) {
			t.Fatalf("NextFrame: %d of %d, %v", n, len(frame), err)
		}
		m, err := wire.DecodeMessage(body)
		if err != nil {
			t.Fatal(err)
		}
		if want := WireEvent(&e); m.T != wire.TPush || m.Conv != e.Conv || !reflect.DeepEqual(m.Event(), want) {
			t.Errorf("push %+v, want %+v of %s", m, want, e.Conv)
		}
		if allocs := testing.AllocsPerRun(200, func() { _, _ = PushFrame(e) }); allocs > 1 {
			t.Errorf("PushFrame: %v allocations, want 1", allocs)
		}
	}
}
