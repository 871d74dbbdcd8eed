package conn_test

// The PROXY protocol in front of the gateway (docs/protocol.md, "Behind
// a TLS proxy"): with proxy_protocol on, a connection from a trusted proxy
// must begin with a v1 or v2 header, whose source address becomes the
// client's address; anything else is closed before any frame and counted.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	proxyproto "github.com/pires/go-proxyproto"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
	"github.com/parley-im/parley/wire"
)

// logBuffer collects a server's log lines (safe for concurrent use).
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// startLogged starts a test server (startEnv's defaults, changed by mod)
// whose debug log goes to the returned buffer.
func startLogged(t *testing.T, mod func(*config.Config)) (*parleytest.Env, *logBuffer) {
	t.Helper()
	cfg := parleytest.Config(t)
	cfg.MaxFrame = 1024
	cfg.MaxBody = 100
	cfg.AuthTimeout = 5 * time.Second
	cfg.IdleTimeout = 30 * time.Second
	if mod != nil {
		mod(&cfg)
	}
	logs := &logBuffer{}
	env := parleytest.StartLogged(t, cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	return env, logs
}

// proxyV2 is a PROXY v2 header naming src as the client (TCP over IPv4).
func proxyV2(t *testing.T, src string) []byte {
	t.Helper()
	h := proxyproto.HeaderProxyFromAddrs(2,
		net.TCPAddrFromAddrPort(netip.MustParseAddrPort(src)),
		net.TCPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:7070")))
	b, err := h.Format()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// dialFrom dials the gateway from the local address from (127.0.0.x).
func dialFrom(t *testing.T, addr, from string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// expectClosedSilently requires the server to close nc without sending
// a byte.
func expectClosedSilently(t *testing.T, nc net.Conn) {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 64)
	n, err := nc.Read(b)
	if n > 0 || err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("want the connection closed silently, got %q, %v", b[:n], err)
	}
}

// proxiedConn sends header on a fresh connection and then authenticates
// dev behind it.
func proxiedConn(t *testing.T, env *parleytest.Env, header []byte, dev parleytest.Device, opt client.DialOptions) *client.Conn {
	t.Helper()
	nc := dialFrom(t, env.Addr, "127.0.0.1")
	if _, err := nc.Write(header); err != nil {
		t.Fatal(err)
	}
	c := client.NewConn(nc, opt)
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Do(ctx, wire.Request{T: wire.TAuth, Device: dev.ID, Token: dev.Token}); err != nil {
		t.Fatalf("auth behind a PROXY header: %v", err)
	}
	return c
}

// proxyMetric is the PROXY header counter of result.
func proxyMetric(env *parleytest.Env, result string) float64 {
	return env.Srv.MetricWith("parley_gateway_proxy_headers_total", "result", result)
}

func TestProxyProtocol(t *testing.T) {
	env, logs := startLogged(t, func(c *config.Config) {
		c.ProxyProtocol = "on"
		c.ProxyTrusted = "127.0.0.1/32"
		c.AuthTimeout = 2 * time.Second
	})

	// The client's address comes from the header, v2 and v1 alike, even
	// when the header arrives a byte at a time with the auth behind it.
	t.Run("ClientAddressFromHeader", func(t *testing.T) {
		for _, c := range []struct {
			name, addr string
			header     []byte
		}{
			{"v2", "198.51.100.7", proxyV2(t, "198.51.100.7:40001")},
			{"v1", "198.51.100.8", []byte("PROXY TCP4 198.51.100.8 127.0.0.1 40002 7070\r\n")},
			{"v1 IPv6", "2001:db8::9", []byte("PROXY TCP6 2001:db8::9 ::1 40003 7070\r\n")},
		} {
			t.Run(c.name, func(t *testing.T) {
				dev := newUser(t, env, "px")
				nc := dialFrom(t, env.Addr, "127.0.0.1")
				for i := range c.header {
					if _, err := nc.Write(c.header[i : i+1]); err != nil {
						t.Fatal(err)
					}
					time.Sleep(time.Millisecond) // arrive in separate reads
				}
				cc := client.NewConn(nc, client.DialOptions{})
				defer cc.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if _, err := cc.Do(ctx, wire.Request{T: wire.TAuth, Device: dev.ID, Token: dev.Token}); err != nil {
					t.Fatalf("auth: %v", err)
				}
				if err := cc.Ping(ctx); err != nil {
					t.Fatal(err)
				}
				want := fmt.Sprintf("device=%s user=%s addr=%s", dev.ID, dev.User, c.addr)
				testenv.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
					if !strings.Contains(logs.String(), want) {
						return fmt.Errorf("the log never says %q", want)
					}
					return nil
				})
			})
		}
		// The header and the auth in one write.
		dev := newUser(t, env, "px")
		nc := dialFrom(t, env.Addr, "127.0.0.1")
		stream := append(proxyV2(t, "198.51.100.10:1"), mustFrame(t, wire.Request{T: wire.TAuth, Rid: "a", Device: dev.ID, Token: dev.Token})...)
		if _, err := nc.Write(stream); err != nil {
			t.Fatal(err)
		}
		fr := wire.NewFrameReader(nc, 1<<20)
		_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		body, err := fr.Next()
		if err != nil {
			t.Fatal(err)
		}
		if m, _ := wire.DecodeMessage(body); m.T != wire.TAuthOK {
			t.Fatalf("got %+v", m)
		}
	})

	// A LOCAL header (a proxy's health check) keeps the peer's address.
	t.Run("LocalCommand", func(t *testing.T) {
		dev := newUser(t, env, "px")
		local := []byte("\r\n\r\n\x00\r\nQUIT\n\x20\x00\x00\x00")
		proxiedConn(t, env, local, dev, client.DialOptions{})
		want := fmt.Sprintf("device=%s user=%s addr=127.0.0.1", dev.ID, dev.User)
		testenv.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
			if !strings.Contains(logs.String(), want) {
				return fmt.Errorf("the log never says %q", want)
			}
			return nil
		})
	})

	// Refused: each closes the connection before any frame, is counted,
	// and leaves no session behind.
	refusals := []struct {
		name, result string
		from         string
		send         []byte
		hangUp       bool // the client closes after sending
	}{
		{"Untrusted", "untrusted", "127.0.0.2", proxyV2(t, "198.51.100.7:1"), false},
		{"Missing", "missing", "127.0.0.1", withBody(mpMap("t", "auth", "device", "d", "token", "x")), false},
		{"GarbageV1", "malformed", "127.0.0.1", []byte("PROXY TCP4 not an address\r\n"), false},
		{"GarbageV2", "malformed", "127.0.0.1", append([]byte("\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x02"), 1, 2), false},
		{"V1TooLong", "malformed", "127.0.0.1", append([]byte("PROXY TCP4 "), bytes.Repeat([]byte("1"), 120)...), false},
		{"V2TooLong", "malformed", "127.0.0.1", []byte("\r\n\r\n\x00\r\nQUIT\n\x21\x11\xff\xff"), false},
		{"Truncated", "truncated", "127.0.0.1", proxyV2(t, "198.51.100.7:1")[:20], true},
		{"TruncatedTimedOut", "truncated", "127.0.0.1", []byte("PROXY TCP4 198.51"), false},
		{"NothingTimedOut", "missing", "127.0.0.1", nil, false},
	}
	for _, c := range refusals {
		t.Run(c.name, func(t *testing.T) {
			before := proxyMetric(env, c.result)
			nc := dialFrom(t, env.Addr, c.from)
			if len(c.send) > 0 {
				if _, err := nc.Write(c.send); err != nil && c.result != "untrusted" {
					t.Fatal(err)
				}
			}
			if c.hangUp {
				nc.Close()
			} else {
				expectClosedSilently(t, nc)
			}
			testenv.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
				if got := proxyMetric(env, c.result); got < before+1 {
					return fmt.Errorf("parley_gateway_proxy_headers_total{result=%q} = %v, want %v", c.result, got, before+1)
				}
				return nil
			})
		})
	}
	// No refused connection is left open.
	testenv.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if n := env.Srv.MetricSum("parley_gateway_connections"); n != 0 {
			return fmt.Errorf("%v connections still open", n)
		}
		return nil
	})

	// The server still serves well-behaved clients behind the proxy.
	a, b := newUser(t, env, "pa"), newUser(t, env, "pb")
	conv := name("c-px")
	env.Group(t, conv, a.User, b.User)
	pushes := make(chan wire.Message, 16)
	ca := proxiedConn(t, env, proxyV2(t, "198.51.100.20:1"), a, client.DialOptions{})
	proxiedConn(t, env, proxyV2(t, "198.51.100.21:1"), b, client.DialOptions{OnServerFrame: func(m wire.Message) {
		if m.T == wire.TPush && string(m.Body) == "through the proxy" {
			pushes <- m
		}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ca.Send(ctx, conv, "m1", []byte("through the proxy")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-pushes:
	case <-ctx.Done():
		t.Fatal("no push")
	}
}

// With proxy_protocol off (the default), a PROXY header is just bytes
// that are not a frame: the framing rules apply.
func TestProxyProtocolOff(t *testing.T) {
	env := startEnv(t, nil)
	r := dialRaw(t, env)
	r.write([]byte("PROXY TCP4 198.51.100.7 127.0.0.1 1 2\r\n"))
	r.expectError(wire.TooLarge, "") // "PROX" read as a length
	r.expectClosed(3 * time.Second)
}
