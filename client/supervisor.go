package client

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/wire"
)

// supervise keeps a connection up until Close, or until the server tells
// us not to come back (kick "replaced", AUTH_FAILED).
func (c *Client) supervise() {
	defer c.wg.Done()
	defer close(c.stopped)
	attempt := 0
	for {
		c.setState(Connecting, nil)
		conn, sess, err := c.dial()
		if err != nil {
			if c.isClosing() {
				return
			}
			delay := c.backoff(attempt)
			switch we, _ := wire.AsError(err); {
			case we != nil && (we.Code == wire.AuthFailed || we.Code == wire.Suspended):
				// Retrying a bad token cannot help; the app must
				// re-provision the device (or the user be unsuspended).
				c.stop(err)
				return
			case we != nil && we.Code == wire.RateLimited:
				// The gateway is busy (a reconnect storm) and says when to
				// come back: wait that long instead of our own backoff,
				// plus a little jitter of our own so the refused clients do
				// not come back together. Not a failure: the backoff does
				// not grow, and the client never gives up over it.
				delay = time.Duration(we.RetryAfterMs)*time.Millisecond + c.jitter(c.opt.MinBackoff)
			default:
				attempt++
			}
			c.log.Info("connect failed", "err", err, "retry_in", delay)
			c.setState(Disconnected, err)
			if !c.sleep(delay) {
				return
			}
			continue
		}
		attempt = 0
		c.setConn(conn)
		c.setState(Connected, nil)
		// Pushes sent while we were away are lost: catch up on every known
		// conversation. (Queued before Start returns, so that the resync
		// covers exactly the conversations known before the connection.)
		c.in.put(resyncItem{})
		c.firstUpOnce.Do(func() { close(c.firstUp) })
		c.wakeAcker()

		refreshed := make(chan struct{})
		if c.opt.JWT != nil {
			go func() { defer close(refreshed); c.refreshLoop(conn) }()
		} else {
			close(refreshed)
		}
		select {
		case <-conn.Done():
		case <-c.closing:
		}
		c.setConn(nil)
		conn.Close()
		<-refreshed
		if c.isClosing() {
			return
		}
		why := conn.Err()
		switch sess.kicked() {
		case wire.KickReplaced:
			c.log.Info("replaced by another connection of this device; not reconnecting")
			c.stop(ErrReplaced)
			return
		case wire.KickRevoked:
			c.log.Info("the device was revoked; not reconnecting")
			c.stop(ErrRevoked)
			return
		case wire.KickSuspended:
			c.log.Info("the user is suspended; not reconnecting")
			c.stop(ErrSuspended)
			return
		case wire.KickExpired:
			why = fmt.Errorf("client: the session's token expired")
		case wire.KickShutdown:
			why = ErrServerShutdown
		case "":
		default:
			why = fmt.Errorf("client: kicked by the server: %s", sess.kicked())
		}
		if why == nil {
			why = ErrClosed
		}
		delay := c.backoff(attempt)
		attempt++
		c.log.Info("disconnected", "err", why, "retry_in", delay)
		c.setState(Disconnected, why)
		if !c.sleep(delay) {
			return
		}
	}
}

// session is what the supervisor needs to know about one connection.
type session struct {
	c    *Client
	kick atomic.Pointer[string]
}

func (s *session) kicked() string {
	if p := s.kick.Load(); p != nil {
		return *p
	}
	return ""
}

// onFrame runs on the connection's reader goroutine: it must not block, so
// it only queues frames for the event loop.
func (s *session) onFrame(m wire.Message) {
	switch m.T {
	case wire.TPush:
		s.c.in.putPush(m)
	case wire.THint, wire.TReadChanged:
		s.c.in.put(m)
	case wire.TKick:
		// Recorded before the reader sees the server close the
		// connection, so the supervisor knows why it ended.
		s.kick.Store(&m.Reason)
	case wire.TError:
		// An error for a request without rid, or for one we stopped
		// waiting for.
		s.c.log.Warn("server error", "code", m.Code, "msg", m.Msg, "rid", m.Rid)
	default:
		// A reply that came after its request timed out.
		s.c.log.Debug("unexpected frame", "frame", m.String())
	}
}

func (c *Client) dial() (*Conn, *session, error) {
	s := &session{c: c}
	ctx, cancel := context.WithTimeout(c.ctx, c.opt.RequestTimeout)
	defer cancel()
	opt := DialOptions{OnServerFrame: s.onFrame, Dialer: c.opt.Dialer, TLS: c.opt.TLS}
	if c.opt.JWT != nil {
		jwt, err := c.opt.JWT(ctx)
		if err != nil {
			return nil, s, fmt.Errorf("client: getting a JWT: %w", err)
		}
		conn, err := DialJWT(ctx, c.opt.Addr, jwt, opt)
		return conn, s, err
	}
	conn, err := Dial(ctx, c.opt.Addr, c.opt.Device, c.opt.Token, opt)
	return conn, s, err
}

// refreshLoop refreshes a JWT session RefreshBefore ahead of its
// expires_at until the connection ends. A failed refresh is tried again
// (after a short backoff) until the session ends; the supervisor then
// reconnects with a new token.
func (c *Client) refreshLoop(conn *Conn) {
	if conn.Auth.ExpiresAt == 0 {
		return // the server did not say when the session ends
	}
	exp := time.UnixMilli(conn.Auth.ExpiresAt)
	for fails := 0; ; {
		before := c.opt.RefreshBefore
		if before <= 0 {
			before = time.Minute
		}
		wait := time.Until(exp.Add(-before))
		if half := time.Until(exp) / 2; wait < half {
			wait = half // never refresh a fresh session in a loop
		}
		if fails > 0 {
			wait = min(c.backoff(fails), time.Until(exp))
		}
		t := time.NewTimer(max(wait, 0))
		select {
		case <-t.C:
		case <-conn.Done():
			t.Stop()
			return
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.opt.RequestTimeout)
		jwt, err := c.opt.JWT(ctx)
		var r wire.Message
		if err == nil {
			r, err = conn.Refresh(ctx, jwt)
		}
		cancel()
		if err != nil {
			fails++
			c.log.Warn("refreshing the session's JWT", "err", err)
			continue
		}
		fails = 0
		exp = time.UnixMilli(r.ExpiresAt)
	}
}

// backoff returns the delay before retry number attempt (from 0): full
// jitter over an exponential bound capped at MaxBackoff.
func (c *Client) backoff(attempt int) time.Duration {
	bound := c.opt.MaxBackoff
	if attempt < 30 {
		bound = min(bound, c.opt.MinBackoff<<attempt)
	}
	return c.jitter(bound)
}

// jitter returns a uniformly random duration in [0, d).
func (c *Client) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d)
}

func (c *Client) setConn(conn *Conn) {
	c.mu.Lock()
	c.conn = conn
	close(c.connCh)
	c.connCh = make(chan struct{})
	c.mu.Unlock()
}

// setState records st and queues OnState(st, err).
func (c *Client) setState(st State, err error) {
	c.mu.Lock()
	c.state = st
	c.mu.Unlock()
	c.in.put(stateItem{st: st, err: err})
}

// stop records why the client stopped for good and reports Closed.
func (c *Client) stop(err error) {
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
	c.setState(Closed, err)
}

func (c *Client) stopErr() error {
	if err := c.Err(); err != nil {
		return err
	}
	return ErrClientClosed
}

// waitConn returns the current connection, waiting for one if needed.
func (c *Client) waitConn(ctx context.Context) (*Conn, error) {
	for {
		c.mu.Lock()
		conn, changed := c.conn, c.connCh
		c.mu.Unlock()
		if conn != nil {
			select {
			case <-conn.Done(): // ending: the supervisor will replace it
			default:
				return conn, nil
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.stopped:
			return nil, c.stopErr()
		case <-c.closing:
			return nil, ErrClientClosed
		}
	}
}

func (c *Client) isClosing() bool {
	select {
	case <-c.closing:
		return true
	default:
		return false
	}
}

// sleep waits d; false if the client closed meanwhile.
func (c *Client) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.closing:
		return false
	}
}

func (c *Client) sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.stopped:
		return c.stopErr()
	case <-c.closing:
		return ErrClientClosed
	}
}
