package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/wire"
)

// tap is a loopback relay between the client and the gateway that shows
// the CLI every frame the server sends. client.Client handles hints and
// kicks itself and has no hook for them, and the CLI wants to print them
// as they arrive (and every frame with -trace). Frames are forwarded
// whole and unchanged, so the client cannot tell the difference; a
// connection to the tap lives exactly as long as its upstream connection.
type tap struct {
	ln        net.Listener
	upstream  string
	timeout   time.Duration
	onFrame   func(wire.Message) // every frame the server sends
	onRequest func(body []byte)  // every frame the client sends (nil: not needed)
	dialErr   atomic.Pointer[error]

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func newTap(upstream string, timeout time.Duration, onFrame func(wire.Message), onRequest func([]byte)) (*tap, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tap: %w", err)
	}
	t := &tap{ln: ln, upstream: upstream, timeout: timeout, onFrame: onFrame, onRequest: onRequest, conns: map[net.Conn]struct{}{}}
	t.wg.Add(1)
	go t.accept()
	return t, nil
}

func (t *tap) addr() string { return t.ln.Addr().String() }

// takeDialErr returns (and forgets) why the last upstream dial failed.
func (t *tap) takeDialErr() error {
	if p := t.dialErr.Swap(nil); p != nil {
		return *p
	}
	return nil
}

func (t *tap) close() {
	t.ln.Close()
	t.mu.Lock()
	t.closed = true
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
}

func (t *tap) track(cs ...net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	for _, c := range cs {
		t.conns[c] = struct{}{}
	}
	return true
}

func (t *tap) untrack(cs ...net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range cs {
		delete(t.conns, c)
		c.Close()
	}
}

func (t *tap) accept() {
	defer t.wg.Done()
	for {
		down, err := t.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", t.upstream, t.timeout)
		if err != nil {
			t.dialErr.Store(&err)
			down.Close() // the client sees the connection fail and backs off
			continue
		}
		if !t.track(down, up) {
			down.Close()
			up.Close()
			return
		}
		t.wg.Add(2)
		go func() { // client → server
			defer t.wg.Done()
			defer t.untrack(up, down)
			pump(down, up, t.onRequest)
		}()
		go func() { // server → client
			defer t.wg.Done()
			defer t.untrack(up, down)
			pump(up, down, func(body []byte) {
				if m, err := wire.DecodeMessage(body); err == nil && t.onFrame != nil {
					t.onFrame(m)
				}
			})
		}()
	}
}

// pump forwards frames from src to dst unchanged, showing each body to
// see (if not nil) first, until either side fails.
func pump(src, dst net.Conn, see func(body []byte)) {
	fr := wire.NewFrameReader(src, 16<<20) // client.Conn's own limit
	var buf []byte
	for {
		body, err := fr.Next()
		if err != nil {
			return
		}
		if see != nil {
			see(body) // first, so that a request shows before its reply
		}
		buf = binary.BigEndian.AppendUint32(buf[:0], uint32(len(body)))
		buf = append(buf, body...)
		if _, err := dst.Write(buf); err != nil {
			return
		}
	}
}
