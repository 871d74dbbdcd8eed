package conn

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/parley-im/parley/cursor"
	"github.com/parley-im/parley/errcode"
	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/fanout"
	"github.com/parley-im/parley/route"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/wire"
)

// handle runs one request on the session's request goroutine; start is
// when the event loop read it (request latency counts from there, so it
// includes the wait for this goroutine).
func (g *Gateway) handle(s *Session, req *wire.Request, start time.Time) {
	if req.T != wire.TAuth && !s.authed.Load() {
		return // auth failed or is being refused; the connection is closing
	}
	if s.expired(time.Now()) {
		// The JWT expired (its timer may not have fired yet): serve nothing more.
		s.checkExpiry()
		return
	}
	// Sends, acks and reads are answered asynchronously, after their group
	// commit; they carry their own deadline into the commit queue.
	switch req.T {
	case wire.TSend:
		g.send(s, req, start)
		return
	case wire.TAck:
		g.ack(s, req, start)
		return
	case wire.TRead:
		g.read(s, req, start)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.RequestTimeout)
	defer cancel()
	switch req.T {
	case wire.TPing: // pipelined behind auth (otherwise answered on the loop)
		g.answer(s, req, nil, wire.Pong{T: wire.TPong, Rid: req.Rid, Ts: time.Now().UnixMilli()})
	case wire.TAuth:
		g.auth(ctx, s, req)
	case wire.TRefresh:
		g.refresh(ctx, s, req)
	case wire.TConvCreate:
		g.convCreate(ctx, s, req)
	case wire.TMembersAdd:
		head, err := g.deps.Log.AddMembers(ctx, req.Conv, s.user, s.device, req.Users)
		g.answer(s, req, err, wire.MembersOK{T: wire.TMembersOK, Rid: req.Rid, Conv: req.Conv, Head: head})
	case wire.TLeave:
		head, err := g.deps.Log.RemoveMember(ctx, req.Conv, s.user, s.device, s.user)
		g.answer(s, req, err, wire.MembersOK{T: wire.TMembersOK, Rid: req.Rid, Conv: req.Conv, Head: head})
	case wire.TSync:
		g.sync(ctx, s, req)
	case wire.TConvs:
		s.settleAcks(ctx) // items report this device's cursors
		g.convs(ctx, s, req)
	case wire.TSnapshot:
		s.settleAcks(ctx)
		g.snapshot(ctx, s, req)
	case wire.TNotifyRegister:
		g.notifyRegister(ctx, s, req)
	case wire.TNotifyUnregister:
		g.notifyUnregister(ctx, s, req)
	case wire.TConvSettings:
		err := g.deps.Store.SetMute(ctx, s.user, req.Conv, req.MutedUntil)
		g.answer(s, req, err, wire.ConvSettingsOK{T: wire.TConvSettingsOK, Rid: req.Rid, Conv: req.Conv, MutedUntil: req.MutedUntil})
	case wire.TRecall:
		res, err := g.deps.Log.Recall(ctx, req.Conv, s.user, s.device, req.Seq, g.cfg.RecallWindow)
		g.answer(s, req, err, wire.RecallOK{T: wire.TRecallOK, Rid: req.Rid, Conv: req.Conv, Seq: res.Seq, Target: req.Seq})
	case wire.TEdit:
		g.edit(ctx, s, req)
	case wire.TClear:
		g.clear(ctx, s, req)
	case wire.TTyping:
		g.typing(s, req, start)
	case wire.TReceipts:
		g.receipts(ctx, s, req)
	case wire.TSettings:
		g.settings(ctx, s, req)
	case wire.TRole, wire.TMemberMute, wire.TBan, wire.TUnban, wire.TConvUpdate:
		g.moderate(ctx, s, req)
	case wire.TMembersRemove:
		g.membersRemove(ctx, s, req)
	default: // the decoder admits only the types above
		g.answer(s, req, wire.Errorf(wire.Internal, "unexpected request type %s", req.T), nil)
	}
	g.metrics.latency.WithLabelValues(req.T).Observe(time.Since(start).Seconds())
}

// answer replies ok, or the error's code. A request without rid gets no
// success reply.
func (g *Gateway) answer(s *Session, req *wire.Request, err error, ok any) {
	if err != nil {
		e := g.wireError(s, req, err)
		g.metrics.errors.WithLabelValues(string(e.Code)).Inc()
		s.reply(wire.ErrorReply(req.Rid, e))
		return
	}
	if req.Rid == "" && req.T != wire.TPing {
		return
	}
	g.metrics.framesOut.WithLabelValues(req.T + "_ok").Inc()
	s.reply(ok)
}

// wireError answers an error of req: its code from the table shared with
// the admin API (package errcode), with a message for the client.
// UNAVAILABLE is only for a backend that is down or timed out; an error
// nobody classified is a bug: INTERNAL, logged with the request.
func (g *Gateway) wireError(s *Session, req *wire.Request, err error) *wire.Error {
	if e, ok := wire.AsError(err); ok {
		return e
	}
	code, class := errcode.Of(err)
	switch class {
	case errcode.Outage:
		g.log.Warn("request failed: backend unavailable", "type", req.T, "rid", req.Rid, "conv", req.Conv, "device", s.device, "addr", s.addr, "err", err)
		return wire.Errorf(code, "a backend is unavailable; retry later")
	case errcode.Bug:
		g.log.Error("request failed: internal error", "type", req.T, "rid", req.Rid, "conv", req.Conv, "device", s.device, "addr", s.addr, "err", err)
		return wire.Errorf(code, "internal error")
	}
	return wire.Errorf(code, "%s", g.errorText(code, req, err))
}

// errorText is the message of a client's error.
func (g *Gateway) errorText(code wire.Code, req *wire.Request, err error) string {
	var forbidden *store.ForbiddenError
	var notMember *store.NotMemberError
	switch code {
	case wire.Forbidden:
		if errors.As(err, &forbidden) {
			return forbidden.Reason
		}
		return "not allowed here"
	case wire.NotMember:
		if errors.As(err, &notMember) { // a moderation request's target
			return "not a member: " + notMember.User
		}
		return "not a member of this conversation"
	case wire.NotFound:
		if errors.Is(err, store.ErrNoMessage) {
			return "no such message"
		}
		return err.Error()
	case wire.Exists:
		return "conversation id is taken"
	case wire.StaleInstall:
		return "this connection belongs to an older install of the device"
	case wire.CursorAhead:
		return "seq is above the conversation's head"
	case wire.NotSender:
		return "only the sender may " + req.T + " a message"
	case wire.RecallWindow:
		return fmt.Sprintf("the recall window (%s) has passed", g.cfg.RecallWindow)
	case wire.EditWindow:
		return fmt.Sprintf("the edit window (%s) has passed", g.cfg.EditWindow)
	}
	return err.Error()
}

func (g *Gateway) auth(ctx context.Context, s *Session, req *wire.Request) {
	// A revocation or suspension that reaches this gateway from now on
	// applies to this auth, even if the lookup below misses it.
	start := time.Now()
	var (
		dev    store.Device
		exp    time.Time
		result string
		we     *wire.Error
		method = "token"
	)
	if req.Has&wire.FJWT != 0 {
		method = "jwt"
		dev, exp, result, we = g.checkJWT(ctx, s, req)
	} else {
		dev, result, we = g.checkToken(ctx, s, req)
	}
	g.metrics.auths.WithLabelValues(method, result).Inc()
	if we != nil {
		g.log.Debug("auth failed", "device", req.Device, "addr", s.addr, "method", method, "result", result)
		g.metrics.errors.WithLabelValues(string(we.Code)).Inc()
		s.fail(req.Rid, we)
		return
	}
	reg, err := g.registers.Do(ctx, route.Registration{User: dev.User, Device: dev.ID})
	if err == nil {
		err = reg.Err
	}
	token, prev := reg.Token, reg.Prev
	if err != nil {
		s.fail(req.Rid, g.wireError(s, req, err))
		return
	}
	g.routesChanged(dev.User)
	s.user, s.device, s.epoch, s.token, s.jwt = dev.User, dev.ID, dev.InstallEpoch, token, method == "jwt"
	if s.jwt {
		s.expireAt(exp)
	}
	s.authed.Store(true)
	g.mu.Lock()
	old := g.devices[dev.ID]
	if !s.closed.Load() {
		g.devices[dev.ID] = s
	}
	g.mu.Unlock()
	if old != nil && old != s {
		old.kickOut("replaced")
	}
	if reason := g.notices.since(dev.ID, dev.User, start); reason != "" {
		// Revoked or suspended while this auth was in flight.
		g.metrics.kicks.WithLabelValues(reason).Inc()
		s.kickOut(reason)
		return
	}
	if prev != nil && (prev.Gateway != g.deps.Routes.Gateway() || prev.Boot != g.deps.Routes.Boot()) {
		if err := g.deps.Bus.Kick(ctx, prev.Gateway, prev.Device, prev.Token); err != nil {
			g.log.Debug("kicking replaced connection", "gateway", prev.Gateway, "err", err)
		}
	}
	if g.deps.Online != nil {
		if _, err := g.onlines.Do(ctx, fanout.OnlineDevice{User: s.user, Device: s.device, Token: s.token}); err != nil {
			// Pushes of big groups miss this device until it reconnects;
			// its sync and hints still find everything.
			g.log.Warn("joining the online index", "device", s.device, "err", err)
		}
	}
	if s.closed.Load() { // closed while authenticating: undo the route
		_, _ = g.disconnects.Do(ctx, route.Disconnected{User: s.user, Device: s.device, Token: s.token})
		return
	}
	g.log.Debug("authenticated", "device", dev.ID, "user", dev.User, "addr", s.addr, "websocket", s.ws != nil, "method", method)
	ok := wire.AuthOK{T: wire.TAuthOK, Rid: req.Rid, User: dev.User, Device: dev.ID,
		InstallEpoch: dev.InstallEpoch, Ts: time.Now().UnixMilli()}
	if s.jwt {
		ok.ExpiresAt = exp.UnixMilli()
	}
	if req.Rid == "" { // no auth_ok to order frames after
		s.answered.Store(true)
		return
	}
	g.metrics.framesOut.WithLabelValues(req.T + "_ok").Inc()
	s.replyAuthOK(ok)
}

// checkToken checks an auth's static device token. It returns the
// device, or the error to refuse the auth with and the result to count.
func (g *Gateway) checkToken(ctx context.Context, s *Session, req *wire.Request) (store.Device, string, *wire.Error) {
	// Looked up together with the other auths arriving meanwhile.
	found, err := g.lookups.Do(ctx, req.Device)
	if err != nil {
		return store.Device{}, authBackend, g.wireError(s, req, err)
	}
	dev := found.dev
	sum := sha256.Sum256([]byte(req.Token))
	want := dev.TokenSHA256
	if len(want) != len(sum) {
		// Compare anyway: the same work for unknown devices, and for
		// devices without a static token (revoked, or provisioned by a JWT).
		want = make([]byte, len(sum))
	}
	if subtle.ConstantTimeCompare(sum[:], want) != 1 || !found.found || len(dev.TokenSHA256) != len(sum) {
		if found.found && dev.Revoked {
			return dev, authRevoked, wire.Errorf(wire.AuthFailed, "unknown device or bad token")
		}
		return dev, authBadToken, wire.Errorf(wire.AuthFailed, "unknown device or bad token")
	}
	if dev.Suspended {
		return dev, authSuspended, wire.Errorf(wire.Suspended, "the user is suspended")
	}
	return dev, authOK, nil
}

func (g *Gateway) convCreate(ctx context.Context, s *Session, req *wire.Request) {
	members := uniq(append(slices.Clone(req.Members), s.user))
	var id string
	switch req.Kind {
	case "direct":
		if len(members) != 2 {
			g.answer(s, req, wire.Errorf(wire.BadRequest, "direct takes exactly one other user"), nil)
			return
		}
		other := members[0]
		if other == s.user {
			other = members[1]
		}
		id = eventlog.DirectID(s.user, other)
	case "group":
		id = req.Conv
		if id == "" {
			id = eventlog.NewGroupID()
		} else if err := eventlog.ValidGroupID(id); err != nil {
			g.answer(s, req, wire.Errorf(wire.BadRequest, "%v", err), nil)
			return
		}
	default:
		g.answer(s, req, wire.Errorf(wire.BadRequest, "kind must be group or direct"), nil)
		return
	}
	err := g.deps.Log.Create(ctx, store.NewConversation{ID: id, Kind: req.Kind, Title: req.Title, Actor: s.user, Members: members})
	if errors.Is(err, store.ErrExists) && req.Kind == "direct" {
		c, cerr := g.deps.Store.ConversationByID(ctx, id)
		g.answer(s, req, cerr, wire.ConvCreateOK{T: wire.TConvCreateOK, Rid: req.Rid, Conv: id, Head: c.Head})
		return
	}
	g.answer(s, req, err, wire.ConvCreateOK{T: wire.TConvCreateOK, Rid: req.Rid, Conv: id, Head: 1})
}

func uniq(xs []string) []string {
	slices.Sort(xs)
	return slices.Compact(xs)
}

func (g *Gateway) send(s *Session, req *wire.Request, start time.Time) {
	if len(req.Body) > g.cfg.MaxBody {
		g.answer(s, req, wire.Errorf(wire.TooLarge, "body is %d bytes; max_body is %d", len(req.Body), g.cfg.MaxBody), nil)
		return
	}
	if wait, ok := s.allowSend(start); !ok {
		g.answer(s, req, &wire.Error{Code: wire.RateLimited, Msg: "send rate exceeded", RetryAfterMs: max(1, wait.Milliseconds())}, nil)
		return
	}
	if req.MentionAll && !g.allowMentionAll(s, req) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.RequestTimeout)
	m := eventlog.Message{Conv: req.Conv, Sender: s.user, Device: s.device, Cmid: req.Cmid, Body: req.Body, Mentions: req.Mentions}
	rid, cmid, conv := req.Rid, req.Cmid, req.Conv
	g.deps.Log.Send(ctx, m, func(r eventlog.SendResult) {
		cancel()
		if r.Err == nil {
			s.know(conv, r.Seq)
		}
		g.metrics.latency.WithLabelValues(wire.TSend).Observe(time.Since(start).Seconds())
		g.answer(s, &wire.Request{T: wire.TSend, Rid: rid, Conv: conv}, r.Err,
			wire.SendOK{T: wire.TSendOK, Rid: rid, Conv: conv, Cmid: cmid, Seq: r.Seq, Ts: r.Ts, Dup: r.Dup})
	})
}

func (g *Gateway) sync(ctx context.Context, s *Session, req *wire.Request) {
	limit := int(req.Limit)
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	p, err := g.deps.Log.Sync(ctx, req.Conv, s.user, req.After, limit)
	if err != nil {
		g.answer(s, req, err, nil)
		return
	}
	evs := make([]wire.Event, len(p.Events))
	for i := range p.Events {
		evs[i] = fanout.WireEvent(&p.Events[i])
	}
	s.know(req.Conv, p.Upto)
	g.answer(s, req, nil, wire.SyncOK{T: wire.TSyncOK, Rid: req.Rid, Conv: req.Conv, Epoch: p.Epoch, Head: p.Head,
		MinSeq: p.MinSeq, Upto: p.Upto, More: p.Upto < p.Head, Events: evs})
}

func (g *Gateway) ack(s *Session, req *wire.Request, start time.Time) {
	// Known: the connection was given this seq, so it is committed and
	// the user is or was a member; PostgreSQL then checks only the epoch.
	a := cursor.Ack{Device: s.device, User: s.user, Conv: req.Conv, Epoch: s.epoch, Seq: req.Seq, Known: s.knows(req.Conv, req.Seq)}
	if req.Rid == "" && a.Known && g.holdsAcks() {
		s.holdAck(a) // heldacks.go
		return
	}
	s.flushAcks(nil) // first: this ack's reply then carries their merge
	g.mergeAck(s, a, req.Rid, start, nil)
}

// holdsAcks reports whether rid-less acks are held (ack_coalesce), which
// stops when the gateway does.
func (g *Gateway) holdsAcks() bool {
	if g.cfg.AckCoalesce <= 0 {
		return false
	}
	select {
	case <-g.stopping:
		return false
	default:
		return true
	}
}

func (g *Gateway) read(s *Session, req *wire.Request, start time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.RequestTimeout)
	rid, conv := req.Rid, req.Conv
	g.deps.Cursors.Read(ctx, store.ReadUpdate{User: s.user, Conv: req.Conv, Seq: req.Seq}, func(r store.ReadResult) {
		cancel()
		g.metrics.latency.WithLabelValues(wire.TRead).Observe(time.Since(start).Seconds())
		g.answer(s, &wire.Request{T: wire.TRead, Rid: rid, Conv: conv}, r.Err, wire.ReadOK{T: wire.TReadOK, Rid: rid, Conv: conv, Read: r.Read, Unread: r.Unread})
		if r.Err != nil || !r.Advanced {
			return
		}
		g.readAdvanced(s, conv, r.Read, r.Unread)
		g.readMoved(s.user, conv, r.Read, r.ReceiptsPrivate)
	})
}

// readAdvanced tells the user's other devices that the read position of
// conv moved, and the notifier that the user's badge changed; best effort
// (every convs and read reply carries the durable value anyway), off the
// caller's goroutine (a commit worker).
func (g *Gateway) readAdvanced(s *Session, conv string, read, unread int64) {
	if g.deps.Notifications != nil {
		g.deps.Notifications.ReadAdvanced(s.user)
	}
	g.goroutine(func() {
		nctx, ncancel := context.WithTimeout(context.Background(), g.cfg.RequestTimeout)
		defer ncancel()
		frame, err := wire.AppendFrame(nil, wire.ReadChanged{T: wire.TReadChanged, Conv: conv, Read: read, Unread: unread})
		if err == nil {
			err = g.deps.ToUser(nctx, s.user, s.device, frame)
		}
		if err != nil {
			g.log.Debug("read_changed", "err", err)
		}
	})
}

func (g *Gateway) convs(ctx context.Context, s *Session, req *wire.Request) {
	limit := int(req.Limit)
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	var from *store.ConvListPosition
	if req.Cursor != "" {
		c, ok := decodeConvsPosition(req.Cursor)
		if !ok {
			g.answer(s, req, wire.Errorf(wire.BadRequest, "cursor: not a cursor from a convs reply"), nil)
			return
		}
		from = &c
	}
	order := store.ConvOrder{SmallBelow: int64(g.cfg.WriteFanoutMax)}
	if g.deps.Rows != nil {
		// Without rows (Redis is down) every conversation is probed.
		if rows, err := g.deps.Rows.Read(ctx, s.user); err == nil {
			order.Rows = rows
		}
	}
	page, err := g.deps.Store.Conversations(ctx, s.user, s.device, limit, from, order)
	if err != nil {
		g.answer(s, req, err, nil)
		return
	}
	if len(page.Backfill) > 0 && g.deps.Rows != nil {
		defer func() {
			if err := g.deps.Rows.Backfill(ctx, s.user, page.Backfill); err != nil {
				g.log.Debug("backfilling conversation rows", "err", err)
			}
		}()
	}
	heads := make([]store.ConvSeq, len(page.Items))
	out := wire.ConvsOK{T: wire.TConvsOK, Rid: req.Rid, More: page.More, Items: make([]wire.ConvItem, len(page.Items))}
	for i, it := range page.Items {
		heads[i] = store.ConvSeq{Conv: it.Conv, Seq: it.Head}
		out.Items[i] = wire.ConvItem{Conv: it.Conv, Kind: it.Kind, Title: it.Title,
			Mode: fanout.TierOf(it.Members, g.cfg.WriteFanoutMax, g.cfg.OnlineFanoutMax).String(), Epoch: it.Epoch, Head: it.Head,
			MinSeq: it.MinSeq, Delivered: it.Delivered, Read: it.Read, Cleared: it.Cleared, Unread: it.Unread, LastTs: it.LastTs, MutedUntil: it.MutedUntil}
	}
	s.knowAll(heads)
	if page.More && page.Next != nil {
		out.Cursor = encodeConvsPosition(*page.Next)
	}
	g.answer(s, req, nil, out)
}

func encodeConvsPosition(c store.ConvListPosition) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.LastTs, 10) + "/" + c.Conv))
}

func decodeConvsPosition(s string) (store.ConvListPosition, bool) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return store.ConvListPosition{}, false
	}
	ts, conv, ok := strings.Cut(string(b), "/")
	n, err := strconv.ParseInt(ts, 10, 64)
	if !ok || err != nil {
		return store.ConvListPosition{}, false
	}
	return store.ConvListPosition{LastTs: n, Conv: conv}, true
}

// maxSnapshot is the most conversations one snapshot request may name.
const maxSnapshot = 500

func (g *Gateway) snapshot(ctx context.Context, s *Session, req *wire.Request) {
	if len(req.Convs) > maxSnapshot {
		g.answer(s, req, wire.Errorf(wire.BadRequest, "convs: at most %d per snapshot", maxSnapshot), nil)
		return
	}
	convs := make([]string, len(req.Convs))
	afters := make([]int64, len(req.Convs))
	for i, c := range req.Convs {
		convs[i], afters[i] = c.Conv, c.After
	}
	items, err := g.snapshots.Do(ctx, store.SnapshotQuery{User: s.user, Convs: convs, Afters: afters})
	if err != nil {
		g.answer(s, req, err, nil)
		return
	}
	heads := make([]store.ConvSeq, 0, len(items))
	for _, it := range items {
		if it.Err == nil {
			heads = append(heads, store.ConvSeq{Conv: it.Conv, Seq: it.Head})
		}
	}
	s.knowAll(heads) // acks after a reconnect's snapshot take the cheap path
	out := wire.SnapshotOK{T: wire.TSnapshotOK, Rid: req.Rid, Items: make([]wire.SnapshotItem, len(items))}
	for i, it := range items {
		wi := wire.SnapshotItem{Conv: it.Conv, Head: it.Head, Read: it.Read, Unread: it.Unread, Skipped: it.Skipped,
			Events: make([]wire.Event, len(it.Events))}
		for j := range it.Events {
			wi.Events[j] = fanout.WireEvent(&it.Events[j])
		}
		if it.Err != nil {
			wi = wire.SnapshotItem{Conv: it.Conv, Events: []wire.Event{}, Error: string(g.wireError(s, req, it.Err).Code)}
		}
		out.Items[i] = wi
	}
	g.answer(s, req, nil, out)
}
