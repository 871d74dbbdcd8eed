package client

import (
	"context"

	"github.com/parley-im/parley/wire"
)

// The thin request wrappers wait for a connection (bounded by ctx), send
// one request on it with the per-request timeout, and do not retry
// (members_add, for one, is not idempotent: a retry would append a second
// join event). Replies that announce new events the server does not push
// to this device (creations, membership changes, recalls made here) make
// the client sync the conversation, so they reach OnEvent like everything
// else.

func (c *Client) do(ctx context.Context, f func(context.Context, *Conn) (wire.Message, error)) (wire.Message, error) {
	conn, err := c.waitConn(ctx)
	if err != nil {
		return wire.Message{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, c.opt.RequestTimeout)
	defer cancel()
	return f(rctx, conn)
}

// Read sets the user's read position in conv (max-merged by the server);
// the reply carries the merged position and the unread count. The user's
// other devices get read_changed; this one does not (OnReadChanged is not
// called for it).
func (c *Client) Read(ctx context.Context, conv string, seq int64) (wire.Message, error) {
	return c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.Read(ctx, conv, seq) })
}

// Ack tells the server this device holds every event of conv up to seq
// (with AutoAck the client does it by itself).
func (c *Client) Ack(ctx context.Context, conv string, seq int64) (wire.Message, error) {
	return c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.Ack(ctx, conv, seq) })
}

// CreateGroup creates a group with the caller and members (id "" lets the
// server choose) and watches it.
func (c *Client) CreateGroup(ctx context.Context, id, title string, members ...string) (wire.Message, error) {
	r, err := c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) {
		return conn.CreateGroup(ctx, id, title, members...)
	})
	if err == nil {
		c.follow(r.Conv, r.Head)
	}
	return r, err
}

// CreateDirect opens (or returns) the direct conversation with other and
// watches it.
func (c *Client) CreateDirect(ctx context.Context, other string) (wire.Message, error) {
	r, err := c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.CreateDirect(ctx, other) })
	if err == nil {
		c.follow(r.Conv, r.Head)
	}
	return r, err
}

// AddMembers adds users to conv (one join event).
func (c *Client) AddMembers(ctx context.Context, conv string, users ...string) (wire.Message, error) {
	r, err := c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) {
		return conn.AddMembers(ctx, conv, users...)
	})
	if err == nil {
		c.follow(conv, r.Head)
	}
	return r, err
}

// Leave leaves conv. The conversation stays known: its leave event is
// still delivered, and a former member may still sync its history.
func (c *Client) Leave(ctx context.Context, conv string) (wire.Message, error) {
	r, err := c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.Leave(ctx, conv) })
	if err == nil {
		c.follow(conv, r.Head)
	}
	return r, err
}

// SetRole gives user the role wire.RoleOwner, RoleAdmin or RoleMember in
// the group conv (the owner only; giving owner transfers ownership and
// makes the caller an admin). The update event (reply's Seq) reaches
// OnEvent.
func (c *Client) SetRole(ctx context.Context, conv, user, role string) (wire.Message, error) {
	return c.update(ctx, conv, func(ctx context.Context, conn *Conn) (wire.Message, error) {
		return conn.SetRole(ctx, conv, user, role)
	})
}

// RemoveMembers removes users from the group conv (the owner: anyone
// but itself; an admin: plain members): one leave event, sent by this
// user, which reaches OnEvent. The removed users' devices receive that
// leave, then nothing more of conv.
func (c *Client) RemoveMembers(ctx context.Context, conv string, users ...string) (wire.Message, error) {
	r, err := c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) {
		return conn.RemoveMembers(ctx, conv, users...)
	})
	if err == nil {
		c.follow(conv, r.Head)
	}
	return r, err
}

// MuteMember refuses user's sends and edits in the group conv until
// mutedUntil (Unix ms; 0 unmutes). The update event reaches OnEvent.
func (c *Client) MuteMember(ctx context.Context, conv, user string, mutedUntil int64) (wire.Message, error) {
	return c.update(ctx, conv, func(ctx context.Context, conn *Conn) (wire.Message, error) {
		return conn.MuteMember(ctx, conv, user, mutedUntil)
	})
}

// Ban bans user from the group conv: a member is removed (an update
// event with Banned, then a leave), and nobody can add the user back
// until Unban. The update event reaches OnEvent; the leave after it, as
// this device's own action, is not pushed to it and reaches OnEvent with
// the conversation's next push or sync.
func (c *Client) Ban(ctx context.Context, conv, user string) (wire.Message, error) {
	return c.update(ctx, conv, func(ctx context.Context, conn *Conn) (wire.Message, error) {
		return conn.Ban(ctx, conv, user)
	})
}

// Unban lifts user's ban from the group conv (it does not add the user
// back). The update event reaches OnEvent.
func (c *Client) Unban(ctx context.Context, conv, user string) (wire.Message, error) {
	return c.update(ctx, conv, func(ctx context.Context, conn *Conn) (wire.Message, error) {
		return conn.Unban(ctx, conv, user)
	})
}

// UpdateConv sets the group conv's title (nil: unchanged; "" clears it)
// and invite policy (wire.InviteAll or InviteAdmins; "": unchanged). The
// update event reaches OnEvent.
func (c *Client) UpdateConv(ctx context.Context, conv string, title *string, invite string) (wire.Message, error) {
	return c.update(ctx, conv, func(ctx context.Context, conn *Conn) (wire.Message, error) {
		return conn.UpdateConv(ctx, conv, title, invite)
	})
}

// update sends a request answered with update_ok and makes sure the
// events up to its seq (the update event, and a ban's leave after it)
// are fetched: the server does not push them to this device.
func (c *Client) update(ctx context.Context, conv string, f func(context.Context, *Conn) (wire.Message, error)) (wire.Message, error) {
	r, err := c.do(ctx, f)
	if err == nil {
		c.follow(conv, r.Seq)
	}
	return r, err
}

// Recall recalls this user's message at seq. The recall event (reply's
// Seq) reaches OnEvent; its Target is seq.
func (c *Client) Recall(ctx context.Context, conv string, seq int64) (wire.Message, error) {
	r, err := c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.Recall(ctx, conv, seq) })
	if err == nil {
		c.follow(conv, r.Seq)
	}
	return r, err
}

// Edit replaces the body of this user's message at seq. The edit event
// (reply's Seq) reaches OnEvent; its Target is seq.
func (c *Client) Edit(ctx context.Context, conv string, seq int64, body []byte) (wire.Message, error) {
	r, err := c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.Edit(ctx, conv, seq, body) })
	if err == nil {
		c.follow(conv, r.Seq)
	}
	return r, err
}

// Clear hides conv's events up to seq from all this user's devices
// ("delete for me"); the reply carries the merged cleared and read
// positions and the unread count.
func (c *Client) Clear(ctx context.Context, conv string, seq int64) (wire.Message, error) {
	return c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.Clear(ctx, conv, seq) })
}

// Typing tells conv's other members this user is typing (no reply).
func (c *Client) Typing(ctx context.Context, conv string) error {
	_, err := c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return wire.Message{}, conn.Typing(conv) })
	return err
}

// Receipts returns the read positions of conv's current members.
func (c *Client) Receipts(ctx context.Context, conv string) (wire.Message, error) {
	return c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.Receipts(ctx, conv) })
}

// SetReceiptsPrivate hides (or shows) this user's read positions from
// other members.
func (c *Client) SetReceiptsPrivate(ctx context.Context, private bool) (wire.Message, error) {
	return c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) {
		return conn.SetReceiptsPrivate(ctx, private)
	})
}

// Convs lists a page of the user's conversations (limit 0: server default;
// pass the previous reply's Cursor for the next page).
func (c *Client) Convs(ctx context.Context, limit int, cursor string) (wire.Message, error) {
	return c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.Convs(ctx, limit, cursor) })
}

// Snapshot sends a snapshot request as is. Its events are not fed to
// OnEvent (a snapshot may skip events; the cursor could not honestly
// advance past them).
func (c *Client) Snapshot(ctx context.Context, convs []wire.ConvAfter) (wire.Message, error) {
	return c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) { return conn.Snapshot(ctx, convs) })
}

// follow watches conv (from 0 if unknown) and makes sure events up to head
// are fetched.
func (c *Client) follow(conv string, head int64) {
	if conv == "" {
		return
	}
	c.lookup(conv, 0)
	c.in.put(hintItem{conv: conv, head: head})
}

// NotifyRegister registers this device's notification address
// (docs/protocol.md §8): provider "apns", "fcm" or "webhook" and its
// token; sandbox sends APNs notifications to Apple's development
// environment. It replaces the device's previous registration.
func (c *Client) NotifyRegister(ctx context.Context, provider, token string, sandbox bool) (wire.Message, error) {
	return c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) {
		return conn.Do(ctx, wire.Request{T: wire.TNotifyRegister, Provider: provider, Token: token, Sandbox: sandbox, Has: wire.FToken})
	})
}

// NotifyUnregister removes this device's notification address.
func (c *Client) NotifyUnregister(ctx context.Context) (wire.Message, error) {
	return c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) {
		return conn.Do(ctx, wire.Request{T: wire.TNotifyUnregister})
	})
}

// Mute mutes conv for the user (all their devices) until mutedUntil (Unix
// ms; 0 unmutes): its messages notify the user's devices only when they
// mention the user.
func (c *Client) Mute(ctx context.Context, conv string, mutedUntil int64) (wire.Message, error) {
	return c.do(ctx, func(ctx context.Context, conn *Conn) (wire.Message, error) {
		return conn.Do(ctx, wire.Request{T: wire.TConvSettings, Conv: conv, MutedUntil: mutedUntil, Has: wire.FMutedUntil})
	})
}
