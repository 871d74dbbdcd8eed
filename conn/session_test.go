package conn_test

// The session rules of docs/protocol.md §2 (auth first and in time,
// AUTH_FAILED, ping, idle_timeout, replacement) and the rid rules of its
// §1, against a real server. Helpers are in gateway_test.go.

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
	"github.com/parley-im/parley/wire"
)

func TestSession(t *testing.T) {
	// Short enough to wait for, long enough that a stalled host (the
	// race detector beside the other packages' tests) does not run a
	// fresh connection into them before its first frame is read.
	env := startEnv(t, func(c *config.Config) {
		c.AuthTimeout = 3 * time.Second
		c.IdleTimeout = 4 * time.Second // above auth_timeout, which the tests below time
	})
	authTimeout, idleTimeout := env.Cfg.AuthTimeout, env.Cfg.IdleTimeout
	// The gateway checks both timeouts once a second.
	const tick = time.Second

	// Any request other than auth (or ping, below) as the first frame:
	// UNAUTHENTICATED, rid echoed, and the connection is closed. A frame
	// with a known t that fails to decode counts as such a frame.
	t.Run("FirstFrameNotAuth", func(t *testing.T) {
		t.Parallel()
		for _, first := range [][]byte{
			mustFrame(t, wire.Request{T: wire.TSend, Rid: "r", Conv: "c", Cmid: "m", Body: []byte("x")}),
			mustFrame(t, wire.Request{T: wire.TSync, Rid: "r", Conv: "c"}),
			mustFrame(t, wire.Request{T: wire.TConvCreate, Rid: "r", Kind: "group", Members: []string{"x"}}),
			withBody(mpMap("t", "send", "rid", "r", "conv", "c")),            // missing fields
			withBody(mpMap("t", "ack", "rid", "r", "conv", "c", "seq", "1")), // wrong type
		} {
			r := dialRaw(t, env)
			r.write(first)
			r.expectError(wire.Unauthenticated, "r")
			r.expectClosed(3 * time.Second)
		}
		// Without rid: the error has none either.
		r := dialRaw(t, env)
		r.send(wire.Request{T: wire.TAck, Conv: "c", Seq: 1})
		r.expectError(wire.Unauthenticated, "")
		r.expectClosed(3 * time.Second)
		assertServerHealthy(t, env)
	})

	// A refused connection authenticates nothing afterwards: an auth
	// pipelined behind the refused frame, or sent right after it, does
	// not replace the device's live connection.
	t.Run("NoAuthAfterRefusal", func(t *testing.T) {
		t.Parallel()
		dev := newUser(t, env, "u")
		live := dialRaw(t, env)
		live.auth(dev)
		auth := mustFrame(t, wire.Request{T: wire.TAuth, Rid: "late", Device: dev.ID, Token: dev.Token})
		// Sent apart, the auth races the close: repeat to catch it.
		for range 20 {
			// The live connection pings as it goes, or a slow host lets
			// idle_timeout (4 s here) close it before the end. expect
			// fails on any other frame, which is the check below too.
			live.ping()
			for _, bad := range [][]byte{
				mustFrame(t, wire.Request{T: wire.TSync, Rid: "r", Conv: "c"}),
				withBody(mpMap("t", "sync", "rid", "r")), // conv missing
			} {
				r := dialRaw(t, env)
				r.write(append(append([]byte(nil), bad...), auth...))
				r.expectError(wire.Unauthenticated, "r")
				r.expectClosed(3 * time.Second)

				r = dialRaw(t, env)
				r.write(bad)
				r.write(auth)
				r.expectError(wire.Unauthenticated, "r")
				r.expectClosed(3 * time.Second)
			}
		}
		live.ping()
		if m, closed := live.nextWithin(300 * time.Millisecond); closed || m.T != "" {
			t.Fatalf("the live connection got %+v (closed %v) from a refused one", m, closed)
		}
		live.ping()
	})

	// No frame within auth_timeout: UNAUTHENTICATED and close. Pings and
	// a partial frame do not count as auth.
	t.Run("AuthTimeout", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name  string
			write []byte
		}{
			{"Silent", nil},
			{"PartialHeader", []byte{0, 0}},
			{"PartialBody", append(binary.BigEndian.AppendUint32(nil, 50), 0x81, 0xa1, 't')},
		} {
			start := time.Now()
			r := dialRaw(t, env)
			if tc.write != nil {
				r.write(tc.write)
			}
			m, closed := r.next(authTimeout + tick + 2*time.Second)
			if closed || m.T != wire.TError || m.Code != wire.Unauthenticated || m.Rid != "" {
				t.Fatalf("%s: got %+v (closed %v), want UNAUTHENTICATED", tc.name, m, closed)
			}
			if d := time.Since(start); d < authTimeout-50*time.Millisecond {
				t.Fatalf("%s: refused after %v, before auth_timeout %v", tc.name, d, authTimeout)
			}
			r.expectClosed(3 * time.Second)
		}
		// Pinging all the while: the pongs come, then the refusal.
		start := time.Now()
		r := dialRaw(t, env)
		for i := 0; ; i++ {
			r.send(wire.Request{T: wire.TPing, Rid: fmt.Sprint(i)})
			m, closed := r.next(3 * time.Second)
			if closed {
				t.Fatalf("closed without UNAUTHENTICATED: %v", r.err)
			}
			if m.T == wire.TPong {
				if time.Since(start) > authTimeout+tick+2*time.Second {
					t.Fatalf("pinging keeps an unauthenticated connection open past auth_timeout")
				}
				time.Sleep(100 * time.Millisecond) // ping pacing
				continue
			}
			if m.T != wire.TError || m.Code != wire.Unauthenticated {
				t.Fatalf("got %+v", m)
			}
			break
		}
		// Any pong still in flight, then the close.
		for {
			m, closed := r.next(3 * time.Second)
			if closed {
				break
			}
			if m.T != wire.TPong {
				t.Fatalf("after UNAUTHENTICATED: %+v", m)
			}
		}
		assertServerHealthy(t, env)
	})

	// Unknown device or bad token: AUTH_FAILED, rid echoed, close.
	t.Run("AuthFailed", func(t *testing.T) {
		t.Parallel()
		dev, other := newUser(t, env, "u"), newUser(t, env, "u")
		for _, req := range []wire.Request{
			{T: wire.TAuth, Rid: "a", Device: "no-such-device", Token: dev.Token},
			{T: wire.TAuth, Rid: "a", Device: dev.ID, Token: dev.Token + "x"},
			{T: wire.TAuth, Rid: "a", Device: dev.ID, Token: other.Token},
			{T: wire.TAuth, Rid: "a", Device: dev.ID, Token: "", Has: wire.FToken},
			{T: wire.TAuth, Device: dev.ID, Token: "nope"}, // no rid: error without one
		} {
			r := dialRaw(t, env)
			r.send(req)
			r.expectError(wire.AuthFailed, req.Rid)
			r.expectClosed(3 * time.Second)
		}
		// The real token still works.
		r := dialRaw(t, env)
		r.auth(dev)
		r.ping()
		assertServerHealthy(t, env)
	})

	// Before auth succeeds, a ping is refused like any other frame: it
	// gets UNAUTHENTICATED (rid echoed) and the connection is closed,
	// with or without rid.
	t.Run("PingBeforeAuth", func(t *testing.T) {
		t.Parallel()
		for _, req := range []wire.Request{{T: wire.TPing, Rid: "p"}, {T: wire.TPing}} {
			r := dialRaw(t, env)
			r.send(req)
			r.expectError(wire.Unauthenticated, req.Rid)
			r.expectClosed(3 * time.Second)
		}
		// A ping pipelined behind an auth is answered after auth_ok.
		dev := newUser(t, env, "u")
		r := dialRaw(t, env)
		buf := mustFrame(t, wire.Request{T: wire.TAuth, Rid: "a", Device: dev.ID, Token: dev.Token})
		r.write(append(buf, mustFrame(t, wire.Request{T: wire.TPing, Rid: "p"})...))
		if m := r.expect(wire.TAuthOK); m.Rid != "a" {
			t.Fatalf("auth_ok = %+v", m)
		}
		if m := r.expect(wire.TPong); m.Rid != "p" {
			t.Fatalf("pong = %+v", m)
		}
		assertServerHealthy(t, env)
	})

	// Before auth, a body that is not a request (BAD_FRAME) is a frame
	// other than auth too: UNAUTHENTICATED and close. An auth with a
	// missing field is BAD_REQUEST, and auth may follow.
	t.Run("BadBodyBeforeAuth", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			body []byte
			rid  string
		}{{[]byte{0xc1}, ""}, {mpMap("t", "nope", "rid", "x"), "x"}, {mpMap("t", "sync", "rid", "y", "conv", 1), "y"}} {
			r := dialRaw(t, env)
			r.write(withBody(c.body))
			r.expectError(wire.Unauthenticated, c.rid)
			r.expectClosed(3 * time.Second)
		}
		r := dialRaw(t, env)
		r.write(withBody(mpMap("t", "auth", "rid", "y", "device", "d")))
		r.expectError(wire.BadRequest, "y")
		r.auth(newUser(t, env, "u"))
		r.ping()
	})

	// An auth answered BAD_REQUEST (a missing, empty or mistyped field)
	// leaves the connection open and unauthenticated: a corrected auth may
	// follow, after any number of bad ones, but only an auth (anything
	// else is UNAUTHENTICATED and close), and only within auth_timeout of
	// connecting, which the bad ones do not extend (docs/protocol.md §2).
	t.Run("AuthRetryAfterBadRequest", func(t *testing.T) {
		t.Parallel()
		bad := [][]byte{
			mpMap("t", "auth", "rid", "b", "device", "d"),                               // no token
			mpMap("t", "auth", "rid", "b", "token", "x"),                                // no device
			mpMap("t", "auth", "rid", "b", "device", "", "token", "x"),                  // empty device
			mpMap("t", "auth", "rid", "b", "device", 7, "token", "x"),                   // mistyped device
			mpMap("t", "auth", "rid", "b", "jwt", ""),                                   // empty jwt
			mpMap("t", "auth", "rid", "b", "jwt", "a.b.c", "device", "d", "token", "x"), // jwt and a token
		}
		for i, b := range bad {
			dev := newUser(t, env, "u")
			r := dialRaw(t, env)
			r.write(withBody(b))
			r.expectError(wire.BadRequest, "b")
			if i%2 == 1 { // and again
				r.write(withBody(b))
				r.expectError(wire.BadRequest, "b")
			}
			r.auth(dev)
			r.ping()
		}
		// After a bad auth, a frame other than auth closes the connection,
		// pipelined with it or not.
		for _, next := range [][]byte{
			mustFrame(t, wire.Request{T: wire.TPing, Rid: "n"}),
			mustFrame(t, wire.Request{T: wire.TSync, Rid: "n", Conv: "c"}),
		} {
			r := dialRaw(t, env)
			r.write(withBody(bad[0]))
			r.expectError(wire.BadRequest, "b")
			r.write(next)
			r.expectError(wire.Unauthenticated, "n")
			r.expectClosed(3 * time.Second)

			r = dialRaw(t, env)
			r.write(append(withBody(bad[0]), next...))
			r.expectError(wire.BadRequest, "b")
			r.expectError(wire.Unauthenticated, "n")
			r.expectClosed(3 * time.Second)
		}
		// Bad auths do not keep a connection past auth_timeout.
		start := time.Now()
		r := dialRaw(t, env)
		for {
			r.write(withBody(bad[0]))
			m, closed := r.next(3 * time.Second)
			if closed {
				t.Fatalf("closed without UNAUTHENTICATED: %v", r.err)
			}
			if m.T == wire.TError && m.Code == wire.BadRequest {
				if time.Since(start) > authTimeout+tick+2*time.Second {
					t.Fatalf("bad auths keep an unauthenticated connection open past auth_timeout")
				}
				time.Sleep(100 * time.Millisecond) // pacing of the retries
				continue
			}
			if m.T != wire.TError || m.Code != wire.Unauthenticated {
				t.Fatalf("got %+v", m)
			}
			break
		}
		if d := time.Since(start); d < authTimeout-50*time.Millisecond {
			t.Fatalf("refused after %v, before auth_timeout %v", d, authTimeout)
		}
		for { // any BAD_REQUEST still in flight, then the close
			m, closed := r.next(3 * time.Second)
			if closed {
				break
			}
			if m.T != wire.TError || m.Code != wire.BadRequest {
				t.Fatalf("after UNAUTHENTICATED: %+v", m)
			}
		}
		assertServerHealthy(t, env)
	})

	// An authenticated connection that sends nothing for idle_timeout is
	// closed; one that pings stays open.
	t.Run("IdleTimeout", func(t *testing.T) {
		t.Parallel()
		busy, _ := authedRaw(t, env)
		idle, _ := authedRaw(t, env)
		idleSince := time.Now()
		var closedAfter time.Duration
		// busy pings every 200 ms while idle's close is waited for.
		testenv.CheckFor(t, idleTimeout+tick+2*time.Second, 200*time.Millisecond, func() error {
			select {
			case <-idle.done:
				closedAfter = time.Since(idleSince)
				return nil
			default:
			}
			busy.ping()
			return fmt.Errorf("an idle connection is still open after %v (idle_timeout %v)", time.Since(idleSince), idleTimeout)
		})
		if closedAfter < idleTimeout-50*time.Millisecond {
			t.Fatalf("idle connection closed after %v, before idle_timeout %v", closedAfter, idleTimeout)
		}
		if m, closed := idle.next(time.Second); !closed {
			t.Fatalf("idle connection got %+v", m)
		}
		// The busy one outlives another idle_timeout.
		for end := time.Now().Add(idleTimeout + tick); time.Now().Before(end); {
			busy.ping()
			time.Sleep(200 * time.Millisecond) // ping pacing, on purpose for a whole idle_timeout
		}
		busy.ping()
	})

	// A second connection of the same device replaces the first: the old
	// one gets {t:"kick", reason:"replaced"} and is closed; the new one
	// works and gets the device's pushes.
	t.Run("Replaced", func(t *testing.T) {
		t.Parallel()
		dev, peer := newUser(t, env, "u"), newUser(t, env, "peer")
		conv := name("c-repl")
		env.Group(t, conv, dev.User, peer.User)
		first := dialRaw(t, env)
		first.auth(dev)
		second := dialRaw(t, env)
		second.auth(dev)
		if m := first.expect(wire.TKick); m.Reason != "replaced" || m.Rid != "" {
			t.Fatalf("kick = %+v", m)
		}
		first.expectClosed(3 * time.Second)
		second.ping()
		second.send(wire.Request{T: wire.TSend, Rid: "s", Conv: conv, Cmid: "m1", Body: []byte("from second")})
		if m := second.expect(wire.TSendOK); m.Seq != 2 {
			t.Fatalf("send_ok = %+v", m)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cp, err := client.Dial(ctx, env.Addr, peer.ID, peer.Token, client.DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer cp.Close()
		if _, err := cp.Send(ctx, conv, "m2", []byte("to the device")); err != nil {
			t.Fatal(err)
		}
		m := second.expect(wire.TPush)
		if m.Seq == 1 { // the join, if fan-out was slower than the auths
			m = second.expect(wire.TPush)
		}
		if m.Seq != 3 || string(m.Body) != "to the device" {
			t.Fatalf("push = %+v", m)
		}
		// And a third replaces the second the same way.
		third := dialRaw(t, env)
		third.auth(dev)
		if m := second.expect(wire.TKick); m.Reason != "replaced" {
			t.Fatalf("kick = %+v", m)
		}
		second.expectClosed(3 * time.Second)
		third.ping()
		assertServerHealthy(t, env)
	})

	// auth on an authenticated connection: BAD_REQUEST; the session is
	// unchanged.
	t.Run("SecondAuth", func(t *testing.T) {
		t.Parallel()
		r, dev := authedRaw(t, env)
		other := newUser(t, env, "u")
		r.send(wire.Request{T: wire.TAuth, Rid: "again", Device: other.ID, Token: other.Token})
		r.expectError(wire.BadRequest, "again")
		conv := name("c-second")
		env.Group(t, conv, dev.User)
		r.send(wire.Request{T: wire.TSync, Rid: "s", Conv: conv})
		if m := r.expect(wire.TSyncOK); m.Head != 1 {
			t.Fatalf("sync = %+v", m)
		}
	})

	// ping without rid: pong without rid.
	t.Run("PingWithoutRid", func(t *testing.T) {
		t.Parallel()
		r, _ := authedRaw(t, env)
		r.write(withBody(mpMap("t", "ping")))
		if m := r.expect(wire.TPong); m.Rid != "" || m.Ts == 0 {
			t.Fatalf("pong = %+v", m)
		}
		r.write(withBody(mpMap("t", "ping", "rid", nil))) // nil counts as absent
		if m := r.expect(wire.TPong); m.Rid != "" {
			t.Fatalf("pong = %+v", m)
		}
	})

	// A request without rid gets no success reply, but its errors, without
	// rid.
	t.Run("RequestWithoutRid", func(t *testing.T) {
		t.Parallel()
		r, dev := authedRaw(t, env)
		conv, theirs := name("c-norid"), name("c-theirs")
		env.Group(t, conv, dev.User)
		env.Group(t, theirs, newUser(t, env, "o").User)

		r.send(wire.Request{T: wire.TSend, Conv: conv, Cmid: "m1", Body: []byte("fire and forget")})
		testenv.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
			r.send(wire.Request{T: wire.TSync, Rid: "s", Conv: conv})
			m := r.expect(wire.TSyncOK) // not send_ok: none is due
			if m.Head != 2 {
				return fmt.Errorf("head %d: the send is not committed yet", m.Head)
			}
			return nil
		})
		r.send(wire.Request{T: wire.TAck, Conv: conv, Seq: 2})
		r.send(wire.Request{T: wire.TSend, Conv: theirs, Cmid: "m2", Body: []byte("x")})
		r.expectError(wire.NotMember, "")
		r.send(wire.Request{T: wire.TSend, Conv: conv, Cmid: "m3", Body: make([]byte, env.Cfg.MaxBody+1)})
		r.expectError(wire.TooLarge, "")
		r.send(wire.Request{T: wire.TAck, Conv: conv, Seq: 99})
		r.expectError(wire.CursorAhead, "")
		r.write(withBody(mpMap("t", "ack", "conv", conv, "seq", "x")))
		r.expectError(wire.BadRequest, "")
		// The ack without rid took effect, silently.
		r.send(wire.Request{T: wire.TAck, Rid: "a", Conv: conv, Seq: 1})
		if m := r.expect(wire.TAckOK); m.Rid != "a" || m.Delivered != 2 {
			t.Fatalf("ack_ok = %+v", m)
		}
		r.ping()
	})
}

// nextWithin returns the next frame if one arrives within d (m.T is ""
// otherwise): for checking that nothing arrives.
func (r *rawConn) nextWithin(d time.Duration) (m wire.Message, closed bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case m = <-r.frames:
		case <-r.done:
			return wire.Message{}, true
		case <-timer.C:
			return wire.Message{}, false
		}
		if r.strict || m.T != wire.TPush {
			return m, false
		}
	}
}

// Over the gateway's auth rate (auth_rate, with a burst of auth_burst):
// auth is answered RATE_LIMITED, rid echoed, with a positive
// retry_after_ms, and the connection is closed. The check comes before
// any lookup: an unknown device is refused the same way, not AUTH_FAILED.
// The refused devices are told different times (a place in line each,
// spread by jitter), so they do not come back as one wave. Connections
// already authenticated are not affected, and a device that comes back
// after its retry_after_ms is served.
func TestAuthRateLimit(t *testing.T) {
	env := startEnv(t, func(c *config.Config) { c.AuthRate, c.AuthBurst = 2, 2 })
	devs := make([]parleytest.Device, 6)
	for i := range devs {
		devs[i] = newUser(t, env, "rl")
	}
	a, b := dialRaw(t, env), dialRaw(t, env)
	a.auth(devs[0])
	b.auth(devs[1]) // the burst is spent

	// Refused: four devices at once, and an unknown one.
	var refused []*rawConn
	for range 5 {
		refused = append(refused, dialRaw(t, env))
	}
	for i, r := range refused {
		dev := "no-such-device"
		if i < 4 {
			dev = devs[2+i].ID
		}
		r.send(wire.Request{T: wire.TAuth, Rid: fmt.Sprint("rl", i), Device: dev, Token: "whatever"})
	}
	waits := map[int64]bool{}
	var first int64
	for i, r := range refused {
		m := r.expectError(wire.RateLimited, fmt.Sprint("rl", i))
		if m.RetryAfterMs <= 0 || m.RetryAfterMs > 31_000 {
			t.Fatalf("retry_after_ms = %d", m.RetryAfterMs)
		}
		r.expectClosed(3 * time.Second)
		waits[m.RetryAfterMs] = true
		if i == 0 {
			first = m.RetryAfterMs
		}
	}
	if len(waits) < 4 {
		t.Errorf("5 refused devices were told %v: want different times", waits)
	}

	// The authenticated connections still work.
	a.ping()
	b.ping()
	// The first refused device, back after retry_after_ms, is served.
	time.Sleep(time.Duration(first) * time.Millisecond) // on purpose: the wait the server asked for
	r := dialRaw(t, env)
	r.send(wire.Request{T: wire.TAuth, Rid: "again", Device: devs[2].ID, Token: devs[2].Token})
	if m := r.expect(wire.TAuthOK); m.Rid != "again" || m.Device != devs[2].ID {
		t.Fatalf("auth after retry_after_ms: %+v", m)
	}
	r.ping()
}

// A device that reconnects while messages to it are committed gets
// auth_ok as its first frame, every time: no push, hint or relayed frame
// reaches a connection before its auth_ok. What was committed meanwhile
// is the client's snapshot's business (docs/protocol.md §2 and "After
// every (re)connect").
func TestNoPushBeforeAuthOK(t *testing.T) {
	env := startEnv(t, nil)
	sender, receiver := newUser(t, env, "snd"), newUser(t, env, "rcv")
	conv := name("c-reconnect")
	env.Group(t, conv, sender.User, receiver.User)

	s := dialRaw(t, env)
	s.auth(sender)
	stop := make(chan struct{})
	sent := make(chan int)
	go func() { // a steady stream of messages to the receiver, bounded
		n := 0
		defer func() { sent <- n }()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for ; n < 30000; n++ { // below what the reader's channel holds
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			frame, err := wire.AppendFrame(nil, wire.Request{T: wire.TSend, Conv: conv, Cmid: fmt.Sprintf("m%d", n), Body: []byte("x")})
			if err != nil {
				return
			}
			_ = s.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if _, err := s.nc.Write(frame); err != nil {
				return
			}
		}
	}()
	defer func() {
		close(stop)
		<-sent
	}()

	// 60 reconnects, or as many as fit in 15 s (at least 10): well within
	// the 30 s the sender runs.
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; i < 60 && (i < 10 || time.Now().Before(deadline)); i++ {
		r := dialRaw(t, env)
		r.strict = true
		r.send(wire.Request{T: wire.TAuth, Rid: "auth", Device: receiver.ID, Token: receiver.Token})
		m, closed := r.next(5 * time.Second)
		if closed || m.T != wire.TAuthOK {
			t.Fatalf("reconnect %d: first frame %+v (closed %v), want auth_ok", i, m, closed)
		}
		// Pushes do arrive once authenticated.
		if m, closed = r.next(5 * time.Second); closed || (m.T != wire.TPush && m.T != wire.THint) {
			t.Fatalf("reconnect %d: after auth_ok %+v (closed %v), want a push", i, m, closed)
		}
		r.nc.Close()
	}
}
