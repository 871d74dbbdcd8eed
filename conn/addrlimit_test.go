package conn_test

// Per-address limits (docs/protocol.md §2): one client address can hold
// at most addr_max_conns connections and make addr_auth_rate auths a
// second; other addresses are not affected, and the gateway's auth_rate
// is not spent on the refused ones.

import (
	"net"
	"testing"
	"time"

	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/wire"
)

// dialFrom dials env from a local address (127.0.0.x).
func dialRawFrom(t *testing.T, env *parleytest.Env, local string) *rawConn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	nc, err := d.Dial("tcp", env.Addr)
	if err != nil {
		t.Fatal(err)
	}
	r := &rawConn{t: t, nc: nc, frames: make(chan wire.Message, 1024), stop: make(chan struct{}), done: make(chan struct{})}
	go r.readLoop()
	t.Cleanup(func() {
		close(r.stop)
		nc.Close()
		<-r.done
	})
	return r
}

func TestAddrMaxConns(t *testing.T) {
	env := startEnv(t, func(c *config.Config) {
		c.AddrLimitExempt = ""
		c.AddrMaxConns = 3
		c.AddrAuthRate = 0
	})
	var held []*rawConn
	for range 3 {
		r := dialRawFrom(t, env, "127.0.0.7")
		r.auth(newUser(t, env, "am"))
		held = append(held, r)
	}
	// The fourth connection from that address is refused before any auth.
	r := dialRawFrom(t, env, "127.0.0.7")
	if m := r.expectError(wire.RateLimited, ""); m.RetryAfterMs <= 0 {
		t.Fatalf("no retry_after_ms: %+v", m)
	}
	r.expectClosed(3 * time.Second)
	// Another address is not affected.
	dialRawFrom(t, env, "127.0.0.8").auth(newUser(t, env, "am"))
	// A connection that closes gives its place back.
	held[0].nc.Close()
	deadline := time.Now().Add(3 * time.Second)
	for {
		r := dialRawFrom(t, env, "127.0.0.7")
		r.send(wire.Request{T: wire.TAuth, Rid: "auth", Device: "x", Token: "y"})
		m, _ := r.next(3 * time.Second)
		if m.Code == wire.AuthFailed {
			break // admitted: the auth itself is then checked
		}
		if m.Code != wire.RateLimited || time.Now().After(deadline) {
			t.Fatalf("after a close: %+v", m)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := env.Srv.MetricSum("parley_gateway_refusals_total"); n < 1 {
		t.Errorf("refusals counted: %v", n)
	}
	assertServerHealthy(t, env)
}

func TestAddrAuthRate(t *testing.T) {
	env := startEnv(t, func(c *config.Config) {
		c.AddrLimitExempt = ""
		c.AddrAuthRate = 1
		c.AddrAuthBurst = 3
		c.AuthRate = 5 // the gateway's own rate: the flood must not spend it
		c.AuthBurst = 5
	})
	// One address floods: three auths pass, the rest are refused with a
	// retry time, each connection closed.
	refused := 0
	for i := range 20 {
		r := dialRawFrom(t, env, "127.0.0.9")
		r.send(wire.Request{T: wire.TAuth, Rid: "auth", Device: "flood", Token: "x"})
		m, _ := r.next(3 * time.Second)
		switch {
		case i < 3 && m.Code == wire.AuthFailed:
		case i >= 3 && m.Code == wire.RateLimited && m.RetryAfterMs > 0:
			refused++
		default:
			t.Fatalf("auth %d from the flooding address: %+v", i, m)
		}
		r.expectClosed(3 * time.Second)
	}
	// Another address still authenticates: the gateway's auth_rate (5)
	// was spent only on the three admitted auths.
	for range 2 {
		dialRawFrom(t, env, "127.0.0.10").auth(newUser(t, env, "ar"))
	}
	if refused != 17 {
		t.Fatalf("refused %d", refused)
	}
}
