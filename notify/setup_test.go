package notify

import (
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/config"
)

// prodClient is the client parleyd builds (HTTPClient), trusting the
// fakes' certificates instead of the system's roots.
func prodClient(srvs ...*httptest.Server) *http.Client {
	roots := x509.NewCertPool()
	for _, s := range srvs {
		roots.AddCert(s.Certificate())
	}
	return httpClient(config.Config{NotifyConcurrency: 4, NotifyTimeout: 5 * time.Second}, roots, h2PingAfter, h2PingTimeout)
}

// blackhole forwards TCP connections to target until it is shut, then
// swallows what either side sends, as a path that died silently does;
// closed is closed when the client closes its side.
type blackhole struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	shut   bool
	closed chan struct{}
	once   sync.Once
}

func newBlackhole(t *testing.T, target string) *blackhole {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target, closed: make(chan struct{})}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				return
			}
			t.Cleanup(func() { c.Close(); s.Close() })
			go b.pipe(s, c, true) // client → server
			go b.pipe(c, s, false)
		}
	}()
	return b
}

func (b *blackhole) pipe(dst, src net.Conn, fromClient bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			if fromClient {
				b.once.Do(func() { close(b.closed) })
			}
			return
		}
		b.mu.Lock()
		shut := b.shut
		b.mu.Unlock()
		if !shut {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
	}
}

// TestHTTPClientHealthCheck: the providers' client pings an HTTP/2
// connection on which nothing arrives and closes it when the ping is not
// answered, instead of keeping a dead connection until a request times
// out on it. parleyd's client pings after 15 s and waits 5 s; this test
// runs the same client with 200 ms and 300 ms.
func TestHTTPClientHealthCheck(t *testing.T) {
	t.Parallel()
	tr := HTTPClient(config.Config{NotifyConcurrency: 1, NotifyTimeout: time.Second}).Transport.(*http.Transport)
	if tr.HTTP2 == nil || tr.HTTP2.SendPingTimeout != h2PingAfter || tr.HTTP2.PingTimeout != h2PingTimeout || !tr.ForceAttemptHTTP2 {
		t.Fatalf("parleyd's client has no HTTP/2 health check: %+v", tr.HTTP2)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, r.Proto)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	hole := newBlackhole(t, srv.Listener.Addr().String())
	client := prodClient(srv)
	client.Transport.(*http.Transport).HTTP2.SendPingTimeout = 200 * time.Millisecond
	client.Transport.(*http.Transport).HTTP2.PingTimeout = 300 * time.Millisecond
	resp, err := client.Get("https://" + hole.ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	proto, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(proto) != "HTTP/2.0" {
		t.Fatalf("spoke %s", proto)
	}
	hole.mu.Lock()
	hole.shut = true
	hole.mu.Unlock()
	select {
	case <-hole.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("a connection on which nothing arrived for 5 s is still open: no health check")
	}
}
