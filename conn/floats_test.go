package conn_test

import (
	"testing"
	"time"

	"github.com/parley-im/parley/wire"
)

// TestIntegersAsFloats: through a real server, a request whose integer
// fields come as float64 or float32 holding exact integers (as
// JavaScript's msgpack encoders write them) is served as if they were
// ints; a float with a fraction is BAD_REQUEST naming the field, and the
// connection stays open (docs/protocol.md §1).
func TestIntegersAsFloats(t *testing.T) {
	env := startEnv(t, nil)
	dev, other := newUser(t, env, "f"), newUser(t, env, "f")
	conv := name("c-float")
	env.Group(t, conv, dev.User, other.User) // seq 1
	r := dialRaw(t, env)
	r.auth(dev)
	r.send(wire.Request{T: wire.TSend, Rid: "s", Conv: conv, Cmid: "m1", Body: []byte("x")})
	if m := r.expect(wire.TSendOK); m.Seq != 2 {
		t.Fatalf("send_ok = %+v", m)
	}

	until := time.Now().Add(time.Hour).UnixMilli()
	r.write(withBody(mpMap("t", "conv_settings", "rid", "cs", "conv", conv, "muted_until", float64(until))))
	if m := r.expect(wire.TConvSettingsOK); m.Rid != "cs" || m.MutedUntil == nil || *m.MutedUntil != until {
		t.Fatalf("conv_settings_ok = %+v, want muted_until %d", m, until)
	}
	r.write(withBody(mpMap("t", "convs", "rid", "cv", "limit", float32(10))))
	if m := r.expect(wire.TConvsOK); len(m.Items) != 1 || m.Items[0].MutedUntil != until || m.Items[0].Head != 2 {
		t.Fatalf("convs_ok = %+v, want one item muted until %d", m, until)
	}
	r.write(withBody(mpMap("t", "sync", "rid", "sy", "conv", conv, "after", float64(1), "limit", float32(5))))
	if m := r.expect(wire.TSyncOK); len(m.Events) != 1 || m.Events[0].Seq != 2 || m.Upto != 2 {
		t.Fatalf("sync_ok = %+v, want seq 2 alone", m)
	}
	r.write(withBody(mpMap("t", "ack", "rid", "a", "conv", conv, "seq", float64(2))))
	if m := r.expect(wire.TAckOK); m.Delivered != 2 {
		t.Fatalf("ack_ok = %+v", m)
	}
	r.write(withBody(mpMap("t", "read", "rid", "rd", "conv", conv, "seq", float32(2))))
	if m := r.expect(wire.TReadOK); m.Read != 2 {
		t.Fatalf("read_ok = %+v", m)
	}
	r.write(withBody(mpMap("t", "snapshot", "rid", "sn", "convs", []any{map[string]any{"conv": conv, "after": float64(0)}})))
	if m := r.expect(wire.TSnapshotOK); len(m.Items) != 1 || m.Items[0].Head != 2 || m.Items[0].Error != "" {
		t.Fatalf("snapshot_ok = %+v", m)
	}

	for _, bad := range [][]byte{
		mpMap("t", "conv_settings", "rid", "b1", "conv", conv, "muted_until", float64(until)+0.5),
		mpMap("t", "ack", "rid", "b1", "conv", conv, "seq", 1.5),
		mpMap("t", "sync", "rid", "b1", "conv", conv, "after", float64(-1)),
	} {
		r.write(withBody(bad))
		r.expectError(wire.BadRequest, "b1")
		r.ping()
	}
	assertServerHealthy(t, env)
}
