package conn_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
	"github.com/parley-im/parley/wire"
)

// pgDelivered is the delivery cursor of (device, conv) in PostgreSQL (-1:
// no row).
func pgDelivered(t *testing.T, env *parleytest.Env, device, conv string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pc, err := pgx.Connect(ctx, env.Cfg.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(ctx)
	var d int64
	err = pc.QueryRow(ctx, `SELECT delivered_seq FROM device_cursors WHERE device_id = $1 AND conv_id = $2`, device, conv).Scan(&d)
	if errors.Is(err, pgx.ErrNoRows) {
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// heldConv starts a connection of a new user, alone in a new group to
// which it sends n messages with rid (so the connection is given their
// seqs); head is the last seq.
func heldConv(t *testing.T, env *parleytest.Env, n int) (r *rawConn, dev parleytest.Device, conv string, head int64) {
	t.Helper()
	r, dev = authedRaw(t, env)
	conv = name("c-held")
	env.Group(t, conv, dev.User)
	for i := 0; i < n; i++ {
		r.send(wire.Request{T: wire.TSend, Rid: name("s"), Conv: conv, Cmid: name("m"), Body: []byte("x")})
		head = r.expect(wire.TSendOK).Seq
	}
	return r, dev, conv, head
}

// handled returns once the connection's requests sent so far were
// handled: they run in order, and a ping would be answered at once.
func handled(r *rawConn, conv string) {
	r.send(wire.Request{T: wire.TSync, Rid: name("h"), Conv: conv})
	r.expect(wire.TSyncOK)
}

// waitDelivered waits up to within for the cursor of (device, conv) in
// PostgreSQL to be want.
func waitDelivered(t *testing.T, env *parleytest.Env, device, conv string, want int64, within time.Duration) {
	t.Helper()
	testenv.CheckFor(t, within, 10*time.Millisecond, func() error {
		if d := pgDelivered(t, env, device, conv); d != want {
			return fmt.Errorf("cursor %d, want %d", d, want)
		}
		return nil
	})
}

// TestHeldAcks: acks without rid of seqs the connection was given are
// held and only the newest per conversation commits; the connection
// still reads its own acks at once (convs, ack with rid), a bad ack does
// not take a held good one down, and a connection that closes hands its
// held acks over at once. The hold here is a minute, so nothing but
// those commits them during the test (TestHeldAcksFlushEvery: the flush).
func TestHeldAcks(t *testing.T) {
	env := startEnv(t, func(c *config.Config) { c.AckCoalesce = time.Minute })

	t.Run("HeldUntilRead", func(t *testing.T) {
		t.Parallel()
		r, dev, conv, head := heldConv(t, env, 5)
		for seq := int64(2); seq <= head; seq++ {
			r.send(wire.Request{T: wire.TAck, Conv: conv, Seq: seq})
		}
		handled(r, conv)
		time.Sleep(100 * time.Millisecond) // on purpose, a check that nothing commits: what an ack_linger would take
		if d := pgDelivered(t, env, dev.ID, conv); d != -1 {
			t.Fatalf("cursor %d in PostgreSQL right after rid-less acks: not held", d)
		}
		if m, _ := r.nextWithin(100 * time.Millisecond); m.T != "" {
			t.Fatalf("a held ack was answered: %+v", m)
		}
		r.send(wire.Request{T: wire.TConvs, Rid: "l"})
		items := r.expect(wire.TConvsOK).Items
		if len(items) != 1 || items[0].Delivered != head {
			t.Fatalf("convs after held acks: %+v, want delivered %d", items, head)
		}
		if d := pgDelivered(t, env, dev.ID, conv); d != head {
			t.Fatalf("cursor %d in PostgreSQL after convs, want %d", d, head)
		}
	})

	t.Run("AckWithRidCarriesHeldOnes", func(t *testing.T) {
		t.Parallel()
		r, _, conv, head := heldConv(t, env, 3)
		r.send(wire.Request{T: wire.TAck, Conv: conv, Seq: head})
		r.send(wire.Request{T: wire.TAck, Rid: "a", Conv: conv, Seq: 1})
		if m := r.expect(wire.TAckOK); m.Delivered != head {
			t.Fatalf("ack_ok after a held ack: %+v, want delivered %d", m, head)
		}
	})

	t.Run("BadAckSparesHeldOne", func(t *testing.T) {
		t.Parallel()
		r, dev, conv, head := heldConv(t, env, 2)
		r.send(wire.Request{T: wire.TAck, Conv: conv, Seq: head})     // held
		r.send(wire.Request{T: wire.TAck, Conv: conv, Seq: head + 5}) // not given: at once, after the held one
		r.expectError(wire.CursorAhead, "")
		if d := pgDelivered(t, env, dev.ID, conv); d != head {
			t.Fatalf("cursor %d after a good held ack and a bad one, want %d", d, head)
		}
	})

	t.Run("CloseHandsThemOver", func(t *testing.T) {
		t.Parallel()
		r, dev, conv, head := heldConv(t, env, 2)
		r.send(wire.Request{T: wire.TAck, Conv: conv, Seq: head})
		handled(r, conv)
		r.nc.Close()
		waitDelivered(t, env, dev.ID, conv, head, 10*time.Second)
	})

	t.Run("AfterSnapshot", func(t *testing.T) {
		t.Parallel()
		_, dev, conv, head := heldConv(t, env, 2)
		r := dialRaw(t, env) // a new connection: it was given nothing yet
		r.auth(dev)
		r.send(wire.Request{T: wire.TSnapshot, Rid: "s", Convs: []wire.ConvAfter{{Conv: conv}}})
		if items := r.expect(wire.TSnapshotOK).Items; len(items) != 1 || items[0].Head != head {
			t.Fatalf("snapshot: %+v", items)
		}
		r.send(wire.Request{T: wire.TAck, Conv: conv, Seq: head}) // its head was given: held
		handled(r, conv)
		if d := pgDelivered(t, env, dev.ID, conv); d != -1 {
			t.Fatalf("cursor %d right after an ack of a snapshot's head: not held", d)
		}
		r.send(wire.Request{T: wire.TConvs, Rid: "l"})
		if items := r.expect(wire.TConvsOK).Items; len(items) != 1 || items[0].Delivered != head {
			t.Fatalf("convs: %+v, want delivered %d", items, head)
		}
	})

	t.Run("StaleInstall", func(t *testing.T) {
		t.Parallel()
		r, dev, conv, head := heldConv(t, env, 2)
		if code := env.Admin(t, http.MethodPost, "/v1/devices/"+dev.ID+"/reinstall", nil, nil); code != http.StatusOK {
			t.Fatalf("reinstall: %d", code)
		}
		r.send(wire.Request{T: wire.TAck, Conv: conv, Seq: head}) // held, refused when handed over
		r.send(wire.Request{T: wire.TConvs, Rid: "l"})            // hands it over
		r.expectError(wire.StaleInstall, "")
		r.expect(wire.TConvsOK)
		if d := pgDelivered(t, env, dev.ID, conv); d != -1 {
			t.Fatalf("stale held ack wrote cursor %d", d)
		}
	})
	assertServerHealthy(t, env)
}

// TestHeldAcksFlushEvery: held acks commit every ack_coalesce with no
// other request to hand them over.
func TestHeldAcksFlushEvery(t *testing.T) {
	env := startEnv(t, func(c *config.Config) { c.AckCoalesce = 200 * time.Millisecond })
	r, dev, conv, head := heldConv(t, env, 3)
	r.send(wire.Request{T: wire.TAck, Conv: conv, Seq: head - 1})
	r.send(wire.Request{T: wire.TAck, Conv: conv, Seq: head})
	waitDelivered(t, env, dev.ID, conv, head, 5*time.Second)
}
