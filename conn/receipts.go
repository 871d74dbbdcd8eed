package conn

import (
	"context"
	"slices"
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
	g.queueReceipt(convUser{conv, user}, read)
}

// receiptLinger: how long a read that moved waits for others to go
// through the gate with it. The reads that waited together share one
// goroutine and one pipeline, instead of one each (in the realistic mix,
// reads asked the gate one or two at a time: BENCHMARKS.md, the row
// "524c5fe against 0c00912"). A receipt frame then waits up to
// relay_coalesce in its devices' outboxes.
const receiptLinger = 20 * time.Millisecond

// receiptQueue holds the reads that moved until their linger ends (the
// newest per (conv, user)).
type receiptQueue struct {
	mu    sync.Mutex
	m     map[convUser]int64 // guarded by mu
	armed bool               // guarded by mu: a flush is scheduled
}

// queueReceipt queues read of k for the next flush through the gate,
// scheduling one if none is.
func (g *Gateway) queueReceipt(k convUser, read int64) {
	q := &g.receiptQueue
	q.mu.Lock()
	if q.m == nil {
		q.m = map[convUser]int64{}
	}
	q.m[k] = max(q.m[k], read)
	arm := !q.armed
	q.armed = true
	q.mu.Unlock()
	if arm {
		time.AfterFunc(receiptLinger, func() {
			select {
			case <-g.stopping:
				return
			default:
			}
			g.goroutine(g.flushReceipts)
		})
	}
}

// flushReceipts sends the queued reads through the gate, in pipelines of
// up to receiptBatch, and pushes the receipts it lets through; reads whose
// window is open wait for it (laterReceipt).
func (g *Gateway) flushReceipts() {
	q := &g.receiptQueue
	q.mu.Lock()
	m := q.m
	q.m, q.armed = nil, false
	q.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.RequestTimeout)
	defer cancel()
	convs := make([]string, 0, len(m))
	for k := range m {
		convs = append(convs, k.conv)
	}
	slices.Sort(convs)
	members := g.members.getMany(ctx, slices.Compact(convs), time.Now())
	reqs := make([]receiptReq, 0, len(m))
	for k, read := range m {
		ms, ok := members[k.conv]
		if !ok || fanout.TierOf(int64(len(ms)), g.cfg.WriteFanoutMax, g.cfg.OnlineFanoutMax) != fanout.TierPush {
			continue // not read (the error is the combined read's), or not push tier
		}
		reqs = append(reqs, receiptReq{k: k, read: read})
	}
	for len(reqs) > 0 {
		n := min(len(reqs), receiptBatch)
		g.sendReceipts(ctx, reqs[:n], members)
		reqs = reqs[n:]
	}
}

// sendReceipts asks the gate about qs in one pipeline and acts on each
// verdict; members holds each conversation's current members.
func (g *Gateway) sendReceipts(ctx context.Context, qs []receiptReq, members map[string][]string) {
	g.metrics.combined.WithLabelValues("receipt").Observe(float64(len(qs)))
	vs, err := g.deps.Receipts.tryMany(ctx, qs)
	if err != nil {
		g.log.Debug("receipt", "err", err)
		return
	}
	for i, v := range vs {
		k := qs[i].k
		switch {
		case v.wait > 0:
			g.laterReceipt(k, qs[i].read, v.wait)
			continue
		case v.send == 0:
			continue
		}
		frame, err := wire.AppendFrame(nil, wire.Receipt{T: wire.TReceipt, Conv: k.conv, User: k.user, Read: v.send})
		if err != nil {
			continue
		}
		if err := g.toOthers(ctx, members[k.conv], k.user, frame); err != nil {
			g.log.Debug("receipt", "err", err)
			continue
		}
		g.metrics.receipts.Inc()
	}
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
		g.queueReceipt(k, r)
	})
}
