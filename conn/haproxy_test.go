package conn_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/test/testenv"
	"github.com/parley-im/parley/wire"
)

// haproxyConfig is the configuration docs/operations.md gives ("TLS and
// client addresses behind HAProxy"), with the test's ports and
// certificate: HAProxy terminates TLS for the TCP and the WebSocket
// listener and sends a PROXY v2 header on each connection to the gateway.
const haproxyConfig = `global
    maxconn 4000

defaults
    mode tcp
    timeout connect 5s
    timeout client 180s
    timeout server 180s

frontend parley_tls
    bind 127.0.0.1:%[1]d ssl crt %[3]s
    default_backend parley_gateway

backend parley_gateway
    server gw1 %[4]s send-proxy-v2

frontend parley_wss
    bind 127.0.0.1:%[2]d ssl crt %[3]s
    default_backend parley_websocket

backend parley_websocket
    server gw1 %[5]s send-proxy-v2
`

// TestHAProxyTLS puts a real HAProxy (the Debian package, installed on
// demand) in front of the gateway: it terminates TLS with a self-signed
// certificate and sends PROXY v2. Clients bound to 127.0.0.7 (TLS over
// TCP) and 127.0.0.8 (WebSocket over TLS) authenticate, send and receive
// through it, and the server knows them by those addresses, not by
// HAProxy's.
func TestHAProxyTLS(t *testing.T) {
	env, logs := startLogged(t, func(c *config.Config) {
		c.ProxyProtocol = "on"
		c.ProxyTrusted = "127.0.0.1/32"
		c.WSListen = "auto"
	})
	dir := t.TempDir()
	pem, tlsCfg := testenv.SelfSigned(t, dir)
	tlsPort, wssPort := testenv.FreePort(t), testenv.FreePort(t)
	cfg := fmt.Sprintf(haproxyConfig, tlsPort, wssPort, filepath.Clean(pem), env.Addr, env.WSAddr)
	tlsAddr, wssAddr := fmt.Sprintf("127.0.0.1:%d", tlsPort), fmt.Sprintf("127.0.0.1:%d", wssPort)
	testenv.HAProxy(t, cfg, tlsAddr, wssAddr)

	a, b := newUser(t, env, "ha"), newUser(t, env, "hb")
	conv := name("c-haproxy")
	env.Group(t, conv, a.User, b.User)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	from := func(ip string) *net.Dialer {
		return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	}
	pushes := func() (chan wire.Message, func(wire.Message)) {
		ch := make(chan wire.Message, 16)
		return ch, func(m wire.Message) {
			if m.T == wire.TPush && m.Seq > 1 {
				ch <- m
			}
		}
	}
	pa, onA := pushes()
	pb, onB := pushes()
	ca, err := client.Dial(ctx, tlsAddr, a.ID, a.Token, client.DialOptions{TLS: tlsCfg, Dialer: from("127.0.0.7"), OnServerFrame: onA})
	if err != nil {
		t.Fatalf("TLS through HAProxy: %v", err)
	}
	defer ca.Close()
	cb, err := client.Dial(ctx, "wss://"+wssAddr+"/v1/ws", b.ID, b.Token, client.DialOptions{TLS: tlsCfg, Dialer: from("127.0.0.8"), OnServerFrame: onB})
	if err != nil {
		t.Fatalf("WebSocket over TLS through HAProxy: %v", err)
	}
	defer cb.Close()

	expectPush := func(ch chan wire.Message, body string) {
		t.Helper()
		select {
		case m := <-ch:
			if m.Conv != conv || string(m.Body) != body {
				t.Fatalf("push = %+v, want %q", m, body)
			}
		case <-ctx.Done():
			t.Fatalf("no push of %q", body)
		}
	}
	if _, err := ca.Send(ctx, conv, "m1", []byte("from tls")); err != nil {
		t.Fatal(err)
	}
	expectPush(pb, "from tls")
	if _, err := cb.Send(ctx, conv, "m2", []byte("from wss")); err != nil {
		t.Fatal(err)
	}
	expectPush(pa, "from wss")
	s, err := cb.Sync(ctx, conv, 0, 0)
	if err != nil || s.Head != 3 {
		t.Fatalf("sync = %+v, %v", s, err)
	}

	for _, want := range []string{
		fmt.Sprintf("device=%s user=%s addr=127.0.0.7 websocket=false", a.ID, a.User),
		fmt.Sprintf("device=%s user=%s addr=127.0.0.8 websocket=true", b.ID, b.User),
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the server's log never says %q", want)
		}
	}
	if n := env.Srv.MetricWith("parley_gateway_proxy_headers_total", "result", "ok"); n < 2 {
		t.Errorf("%v PROXY headers accepted, want 2", n)
	}

	// The same client straight to the gateway, without HAProxy: refused.
	nc, err := from("127.0.0.7").Dial("tcp", env.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	expectClosedSilently(t, nc)
}
