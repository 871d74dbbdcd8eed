package conn

import (
	"context"

	"github.com/parley-im/parley/wire"
)

// clear sets the caller's "delete for me" position in req.Conv to
// req.Seq (max-merged), which raises the read position to at least it
// (docs/protocol.md, Message features). When the read position moved, the
// user's other devices get read_changed, as for a read report.
func (g *Gateway) clear(ctx context.Context, s *Session, req *wire.Request) {
	r, err := g.deps.Store.Clear(ctx, s.user, req.Conv, req.Seq)
	g.answer(s, req, err, wire.ClearOK{T: wire.TClearOK, Rid: req.Rid, Conv: req.Conv, Cleared: r.Cleared, Read: r.Read, Unread: r.Unread})
	if err != nil || !r.ReadAdvanced {
		return
	}
	g.readAdvanced(s, req.Conv, r.Read, r.Unread)
	g.readMoved(s.user, req.Conv, r.Read, r.ReceiptsPrivate)
}
