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
// that arrives while the window is open is sent when it closes (the
// newest read position then, read from PostgreSQL, so the gateways
// waiting for the same window send it once).
type ReceiptGate struct {
	rdb    redis.UniversalClient
	prefix string
}

// NewReceiptGate returns the gate on rdb, its keys under prefix.
func NewReceiptGate(rdb redis.UniversalClient, prefix string) *ReceiptGate {
	return &ReceiptGate{rdb: rdb, prefix: prefix}
}

// try asks to send read for (conv, user): 0 (send it now), wait > 0 (ask
// again then), or stale (a receipt at or above it was sent).
func (r *ReceiptGate) try(ctx context.Context, conv, user string, read int64) (wait time.Duration, stale bool, err error) {
	base := r.prefix + "rcpt:{" + conv + "}:" + user
	v, err := scripts.ReceiptGate.Run(ctx, r.rdb, []string{base, base + ":last"}, read, receiptWindow.Milliseconds(), 86400).Int64()
	switch {
	case err != nil:
		return 0, false, err
	case v == 0:
		return 0, true, nil
	case v < 0:
		return time.Duration(-v) * time.Millisecond, false, nil
	}
	return 0, false, nil
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
// the user's receipts are private; coalesced by the ReceiptGate. Best
// effort (receipts answers with the durable values); off the caller's
// goroutine.
func (g *Gateway) readMoved(user, conv string, read int64) {
	if g.deps.Receipts == nil {
		return
	}
	g.goroutine(func() { g.sendReceipt(convUser{conv, user}, read, false) })
}

// sendReceipt sends read (or, if fresh, the durable read position: a
// receipt that waited for its window sends the newest one, whichever
// gateway's timer fires first) through the gate.
func (g *Gateway) sendReceipt(k convUser, read int64, fresh bool) {
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.RequestTimeout)
	defer cancel()
	if fresh {
		r, err := g.deps.Store.ReadPosition(ctx, k.user, k.conv)
		if err != nil {
			g.log.Debug("receipt: read position", "err", err)
			return
		}
		read = max(read, r)
	}
	now := time.Now()
	members, err := g.members.get(ctx, k.conv, now)
	if err != nil {
		g.log.Debug("receipt: members", "err", err)
		return
	}
	if fanout.TierOf(int64(len(members)), g.cfg.WriteFanoutMax, g.cfg.OnlineFanoutMax) != fanout.TierPush {
		return
	}
	wait, stale, err := g.deps.Receipts.try(ctx, k.conv, k.user, read)
	switch {
	case err != nil:
		g.log.Debug("receipt: gate", "err", err)
		return
	case stale:
		return
	case wait > 0:
		g.laterReceipt(k, read, wait)
		return
	}
	private, err := g.deps.Store.ReceiptsPrivate(ctx, k.user)
	if err != nil || private {
		return
	}
	frame, err := wire.AppendFrame(nil, wire.Receipt{T: wire.TReceipt, Conv: k.conv, User: k.user, Read: read})
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
		g.goroutine(func() { g.sendReceipt(k, r, true) })
	})
}
