package conn

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/fanout"
	"github.com/parley-im/parley/scripts"
	"github.com/parley-im/parley/wire"
)

// receiptWindow: at most one receipt push per (conversation, user) per
// window, over all gateways.
const receiptWindow = time.Second

// ReceiptGate coalesces receipt pushes per (conversation, user) over every
// gateway sharing one Redis (scripts/receipt_gate.lua): at most one per
// window, never one that does not advance past the last one sent; a read
// that arrives while the window is open is kept in Redis as the newest
// pending one and sent when the window closes (by whichever gateway asks
// first then: the others find it sent).
type ReceiptGate struct {
	rdb    redis.UniversalClient
	prefix string
}

// NewReceiptGate returns the gate on rdb, its keys under prefix.
func NewReceiptGate(rdb redis.UniversalClient, prefix string) *ReceiptGate {
	return &ReceiptGate{rdb: rdb, prefix: prefix}
}

// tryMany asks the gate about each receipt, in one pipeline (in order:
// of two reads of one (conv, user) in it, the first opens the window and
// the second waits): send now (the newest read the gate holds, which may
// be above the one asked about), wait and ask again, or neither (a
// receipt at or above it was sent).
func (r *ReceiptGate) tryMany(ctx context.Context, qs []receiptReq) ([]receiptVerdict, error) {
	cmds := make([]*redis.Cmd, len(qs))
	_, err := scripts.RunPipelined(ctx, r.rdb, func(p redis.Pipeliner) {
		for i, q := range qs {
			base := r.prefix + "rcpt:{" + q.k.conv + "}:" + q.k.user
			cmds[i] = scripts.ReceiptGate.EvalSha(ctx, p, []string{base, base + ":last", base + ":pending"}, q.read, receiptWindow.Milliseconds(), 86400)
		}
	})
	if err != nil {
		return nil, err
	}
	out := make([]receiptVerdict, len(qs))
	for i, c := range cmds {
		v, err := c.Int64()
		if err != nil {
			return nil, err
		}
		switch {
		case v > 0:
			out[i].send = v
		case v < 0:
			out[i].wait = time.Duration(-v) * time.Millisecond
		}
	}
	return out, nil
}

// pendingReceipts are reads waiting for their (conv, user)'s window to
// close on this gateway.
type pendingReceipts struct {
	mu sync.Mutex
	m  map[convUser]int64 // guarded by mu: the newest read to send
}

type convUser struct{ conv, user string }

// receipts answers the receipts request: the current members' read
// positions, in push-tier conversations only.
func (g *Gateway) receipts(ctx context.Context, s *Session, req *wire.Request) {
	r, err := g.deps.Store.Receipts(ctx, req.Conv, s.user)
	if err == nil && fanout.TierOf(r.Members, g.cfg.WriteFanoutMax, g.cfg.OnlineFanoutMax) != fanout.TierPush {
		err = wire.Errorf(wire.Forbidden, "receipts are kept for conversations of fewer than %d members", g.cfg.WriteFanoutMax)
	}
	out := wire.ReceiptsOK{T: wire.TReceiptsOK, Rid: req.Rid, Conv: req.Conv, Reads: make([]wire.UserRead, len(r.Reads))}
	for i, u := range r.Reads {
		out.Reads[i] = wire.UserRead{User: u.User, Read: u.Read}
	}
	g.answer(s, req, err, out)
}

// settings sets the user's settings (receipts_private).
func (g *Gateway) settings(ctx context.Context, s *Session, req *wire.Request) {
	private, err := g.deps.Store.SetReceiptsPrivate(ctx, s.user, req.ReceiptsPrivate)
	g.answer(s, req, err, wire.SettingsOK{T: wire.TSettingsOK, Rid: req.Rid, ReceiptsPrivate: private})
}

// readMoved pushes a receipt of user's new read position in conv to the
// other current members' online devices, in push-tier conversations, unless
// the user's receipts are private (as of the transaction that moved it);
// coalesced by the ReceiptGate. Best effort (receipts answers with the
// durable values); off the caller's goroutine.
func (g *Gateway) readMoved(user, conv string, read int64, private bool) {
	if g.deps.Receipts == nil || private {
		return
	}
	g.goroutine(func() { g.sendReceipt(convUser{conv, user}, read) })
}

// receiptReq is one read position to send as a receipt.
type receiptReq struct {
	k    convUser
	read int64
}

// receiptVerdict is what became of a receiptReq: send this read position
// now (send > 0: the asked one or a newer one the gate held), ask again
// after wait, or neither (a receipt at or above it was sent).
type receiptVerdict struct {
	send int64
	wait time.Duration
}

// sendReceipt sends read (or the newer one the gate holds) through the
// gate to the conversation's other members.
func (g *Gateway) sendReceipt(k convUser, read int64) {
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.RequestTimeout)
	defer cancel()
	members, err := g.members.get(ctx, k.conv, time.Now())
	if err != nil {
		g.log.Debug("receipt: members", "err", err)
		return
	}
	if fanout.TierOf(int64(len(members)), g.cfg.WriteFanoutMax, g.cfg.OnlineFanoutMax) != fanout.TierPush {
		return
	}
	v, err := g.receiptChecks.Do(ctx, receiptReq{k: k, read: read})
	switch {
	case err != nil:
		g.log.Debug("receipt", "err", err)
		return
	case v.wait > 0:
		g.laterReceipt(k, read, v.wait)
		return
	case v.send == 0:
		return
	}
	frame, err := wire.AppendFrame(nil, wire.Receipt{T: wire.TReceipt, Conv: k.conv, User: k.user, Read: v.send})
	if err != nil {
		return
	}
	if err := g.toOthers(ctx, members, k.user, frame); err != nil {
		g.log.Debug("receipt", "err", err)
		return
	}
	g.metrics.receipts.Inc()
}

// laterReceipt keeps read for k and tries again once the window closed
// (one timer per key; a newer read replaces the kept one).
func (g *Gateway) laterReceipt(k convUser, read int64, wait time.Duration) {
	p := &g.pendingReceipts
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[convUser]int64{}
	}
	prev, waiting := p.m[k]
	p.m[k] = max(prev, read)
	if waiting {
		return
	}
	time.AfterFunc(wait+5*time.Millisecond, func() {
		p.mu.Lock()
		r := p.m[k]
		delete(p.m, k)
		p.mu.Unlock()
		select {
		case <-g.stopping:
			return
		default:
		}
		g.goroutine(func() { g.sendReceipt(k, r) })
	})
}
