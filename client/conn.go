package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/wire"
)

// ErrClosed is returned for requests on a closed connection.
var ErrClosed = errors.New("client: connection closed")

// Conn is one authenticated connection: requests with rid and a timeout,
// and every server-initiated frame (push, hint, read_changed, kick) handed
// to a callback. It does not reconnect; Client does.
type Conn struct {
	// Static after Dial.
	nc       net.Conn
	onServer func(wire.Message)
	Auth     wire.Message // the auth_ok reply

	wmu sync.Mutex // serializes writes
	buf []byte

	mu      sync.Mutex
	pending map[string]chan wire.Message
	err     error // why the connection ended

	nextRid atomic.Uint64
	done    chan struct{}
}

// DialOptions tune Dial.
type DialOptions struct {
	// OnServerFrame receives push, hint, read_changed and kick frames, in
	// arrival order, on the connection's reader goroutine: it must not block
	// for long.
	OnServerFrame func(wire.Message)
	// Dialer, if set, dials the TCP connection (e.g. from another 127.0.0.x).
	Dialer *net.Dialer
	// TLS, if set, wraps the connection in TLS (for a TCP address; a
	// wss:// address uses it for its TLS).
	TLS *tls.Config
	// MaxFrame is the largest frame accepted from the server (default 16 MiB).
	MaxFrame int
}

// Dial connects to addr and authenticates as device with token. addr is
// a TCP host:port, or a WebSocket URL (ws://host:port/v1/ws, wss://…).
func Dial(ctx context.Context, addr, device, token string, opt DialOptions) (*Conn, error) {
	return dial(ctx, addr, wire.Request{T: wire.TAuth, Device: device, Token: token}, opt)
}

// DialJWT connects to addr and authenticates with a JSON Web Token (its
// sub is the user, its device claim the device; docs/auth.md). The
// connection lives until the token's exp (Auth.ExpiresAt, Unix ms)
// unless Refresh extends it.
func DialJWT(ctx context.Context, addr, jwt string, opt DialOptions) (*Conn, error) {
	return dial(ctx, addr, wire.Request{T: wire.TAuth, JWT: jwt}, opt)
}

func dial(ctx context.Context, addr string, auth wire.Request, opt DialOptions) (*Conn, error) {
	d := opt.Dialer
	if d == nil {
		d = &net.Dialer{}
	}
	var nc net.Conn
	var err error
	if IsWebSocketURL(addr) {
		nc, err = DialWebSocket(ctx, addr, d, opt.TLS)
	} else {
		nc, err = d.DialContext(ctx, "tcp", addr)
		if err == nil && opt.TLS != nil {
			tc := tls.Client(nc, opt.TLS)
			if err = tc.HandshakeContext(ctx); err != nil {
				nc.Close()
			}
			nc = tc
		}
	}
	if err != nil {
		return nil, err
	}
	c := NewConn(nc, opt)
	ok, err := c.Do(ctx, auth)
	if err != nil {
		c.Close()
		return nil, err
	}
	c.Auth = ok
	return c, nil
}

// Refresh hands the server a new JWT of the same user and device; the
// reply's ExpiresAt is the connection's new end. A refused refresh
// (AUTH_FAILED, TOKEN_EXPIRED) leaves the connection open until its
// current end.
func (c *Conn) Refresh(ctx context.Context, jwt string) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TRefresh, JWT: jwt})
}

// NewConn wraps an established connection without authenticating (tests
// use it to send anything at all).
func NewConn(nc net.Conn, opt DialOptions) *Conn {
	if opt.MaxFrame <= 0 {
		opt.MaxFrame = 16 << 20
	}
	c := &Conn{nc: nc, onServer: opt.OnServerFrame, pending: map[string]chan wire.Message{}, done: make(chan struct{})}
	go c.readLoop(opt.MaxFrame)
	return c
}

// Done is closed when the connection ends.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err says why the connection ended (after Done).
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection.
func (c *Conn) Close() error {
	err := c.nc.Close()
	<-c.done
	return err
}

// Do sends req with a fresh rid and waits for its reply. An error frame
// comes back as *wire.Error.
func (c *Conn) Do(ctx context.Context, req wire.Request) (wire.Message, error) {
	req.Rid = strconv.FormatUint(c.nextRid.Add(1), 36)
	ch := make(chan wire.Message, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return wire.Message{}, ErrClosed
	}
	c.pending[req.Rid] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, req.Rid)
		c.mu.Unlock()
	}()
	if err := c.Write(req); err != nil {
		return wire.Message{}, err
	}
	select {
	case m := <-ch:
		if m.T == wire.TError {
			return m, m.Err()
		}
		return m, nil
	case <-c.done:
		// The reply may have arrived just before the close: prefer it.
		select {
		case m := <-ch:
			if m.T == wire.TError {
				return m, m.Err()
			}
			return m, nil
		default:
		}
		return wire.Message{}, fmt.Errorf("%w: %v", ErrClosed, c.Err())
	case <-ctx.Done():
		return wire.Message{}, ctx.Err()
	}
}

// Write sends one frame without waiting for anything.
func (c *Conn) Write(v any) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	var err error
	if c.buf, err = wire.AppendFrame(c.buf[:0], v); err != nil {
		return err
	}
	return c.WriteRaw(c.buf)
}

// WriteAll sends frames (requests without rid, whose replies, if any, go
// to OnServerFrame) in one write.
func (c *Conn) WriteAll(vs ...any) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.buf = c.buf[:0]
	for _, v := range vs {
		var err error
		if c.buf, err = wire.AppendFrame(c.buf, v); err != nil {
			return err
		}
	}
	return c.WriteRaw(c.buf)
}

// WriteRaw sends bytes as they are (tests send garbage with it).
func (c *Conn) WriteRaw(b []byte) error {
	_ = c.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := c.nc.Write(b)
	return err
}

func (c *Conn) readLoop(max int) {
	fr := wire.NewFrameReader(c.nc, max)
	var err error
	for {
		var body []byte
		if body, err = fr.Next(); err != nil {
			break
		}
		m, derr := wire.DecodeMessage(body)
		if derr != nil {
			err = derr
			break
		}
		if m.Rid != "" {
			c.mu.Lock()
			ch := c.pending[m.Rid]
			c.mu.Unlock()
			if ch != nil {
				ch <- m
				continue
			}
		}
		if c.onServer != nil {
			c.onServer(m)
		}
	}
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
	c.nc.Close()
	close(c.done)
}

// Ping round-trips a ping.
func (c *Conn) Ping(ctx context.Context) error {
	_, err := c.Do(ctx, wire.Request{T: wire.TPing})
	return err
}

// Send sends a message; the reply is send_ok (Seq, Ts, Dup).
func (c *Conn) Send(ctx context.Context, conv, cmid string, body []byte) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TSend, Conv: conv, Cmid: cmid, Body: body})
}

// Sync reads a page of events after `after` (limit 0: server default).
func (c *Conn) Sync(ctx context.Context, conv string, after int64, limit int) (wire.Message, error) {
	req := wire.Request{T: wire.TSync, Conv: conv, After: after, Limit: int64(limit)}
	if limit > 0 {
		req.Has |= wire.FLimit
	}
	return c.Do(ctx, req)
}

// Ack reports that this device holds every event of conv up to seq.
func (c *Conn) Ack(ctx context.Context, conv string, seq int64) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TAck, Conv: conv, Seq: seq})
}

// Read reports that the user has read conv up to seq.
func (c *Conn) Read(ctx context.Context, conv string, seq int64) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TRead, Conv: conv, Seq: seq})
}

// Recall recalls the message at seq.
func (c *Conn) Recall(ctx context.Context, conv string, seq int64) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TRecall, Conv: conv, Seq: seq})
}

// Edit replaces the body of this user's message at seq (an edit event).
func (c *Conn) Edit(ctx context.Context, conv string, seq int64, body []byte) (wire.Message, error) {
	if body == nil {
		body = []byte{}
	}
	return c.Do(ctx, wire.Request{T: wire.TEdit, Conv: conv, Seq: seq, Body: body})
}

// Clear hides the events of conv up to seq from all this user's devices
// ("delete for me") and raises the read position to at least seq.
func (c *Conn) Clear(ctx context.Context, conv string, seq int64) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TClear, Conv: conv, Seq: seq, Has: wire.FSeq})
}

// Typing tells the other members that this user is typing in conv
// (fire-and-forget: no reply; an error, NOT_MEMBER, arrives as a frame
// without rid). The server relays at most one per 2 s per device and
// conversation, in push-tier conversations only.
func (c *Conn) Typing(conv string) error {
	return c.Write(wire.Request{T: wire.TTyping, Conv: conv})
}

// Receipts returns the read positions of conv's current members (push
// tier only: FORBIDDEN otherwise).
func (c *Conn) Receipts(ctx context.Context, conv string) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TReceipts, Conv: conv})
}

// SetReceiptsPrivate hides (or shows) this user's read positions from
// other members.
func (c *Conn) SetReceiptsPrivate(ctx context.Context, private bool) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TSettings, ReceiptsPrivate: private, Has: wire.FReceiptsPrivate})
}

// CreateGroup creates a group (id "" lets the server choose).
func (c *Conn) CreateGroup(ctx context.Context, id, title string, members ...string) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TConvCreate, Kind: "group", Conv: id, Title: title, Members: members})
}

// CreateDirect opens (or returns) the direct conversation with other.
func (c *Conn) CreateDirect(ctx context.Context, other string) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TConvCreate, Kind: "direct", Members: []string{other}})
}

// AddMembers adds users to conv.
func (c *Conn) AddMembers(ctx context.Context, conv string, users ...string) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TMembersAdd, Conv: conv, Users: users})
}

// Leave leaves conv.
func (c *Conn) Leave(ctx context.Context, conv string) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TLeave, Conv: conv})
}

// Convs lists a page of the user's conversations.
func (c *Conn) Convs(ctx context.Context, limit int, cursor string) (wire.Message, error) {
	req := wire.Request{T: wire.TConvs, Limit: int64(limit), Cursor: cursor}
	if limit > 0 {
		req.Has |= wire.FLimit
	}
	return c.Do(ctx, req)
}

// Snapshot pulls many conversations in one round trip.
func (c *Conn) Snapshot(ctx context.Context, convs []wire.ConvAfter) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TSnapshot, Convs: convs})
}

// SetRole gives user the role ("owner", "admin" or "member") in the group
// conv; the reply is update_ok (Seq: the update event). Giving "owner"
// transfers ownership: the caller, the owner, becomes an admin.
func (c *Conn) SetRole(ctx context.Context, conv, user, role string) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TRole, Conv: conv, User: user, Role: role})
}

// RemoveMembers removes users from the group conv (one leave event, sent
// by the caller); the reply is members_ok (Head).
func (c *Conn) RemoveMembers(ctx context.Context, conv string, users ...string) (wire.Message, error) {
	if users == nil {
		users = []string{}
	}
	return c.Do(ctx, wire.Request{T: wire.TMembersRemove, Conv: conv, Users: users})
}

// MuteMember stops user from sending to conv until mutedUntil (Unix ms;
// 0 unmutes); the reply is update_ok.
func (c *Conn) MuteMember(ctx context.Context, conv, user string, mutedUntil int64) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TMemberMute, Conv: conv, User: user, MutedUntil: mutedUntil, Has: wire.FMutedUntil})
}

// Ban bans user from conv (removing them if they are a member); the reply
// is update_ok.
func (c *Conn) Ban(ctx context.Context, conv, user string) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TBan, Conv: conv, User: user})
}

// Unban lifts user's ban from conv (without adding them back); the reply
// is update_ok.
func (c *Conn) Unban(ctx context.Context, conv, user string) (wire.Message, error) {
	return c.Do(ctx, wire.Request{T: wire.TUnban, Conv: conv, User: user})
}

// UpdateConv changes the group conv's title (nil: unchanged; "" clears
// it) and invite policy ("all", "admins"; "": unchanged); the reply is
// update_ok.
func (c *Conn) UpdateConv(ctx context.Context, conv string, title *string, invite string) (wire.Message, error) {
	req := wire.Request{T: wire.TConvUpdate, Conv: conv, Invite: invite}
	if title != nil {
		req.Title = *title
		req.Has |= wire.FTitle
	}
	return c.Do(ctx, req)
}
