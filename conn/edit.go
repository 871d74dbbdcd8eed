package conn

import (
	"context"

	"github.com/parley-im/parley/wire"
)

// edit appends an edit event for the caller's message req.Seq with the
// new body req.Body (docs/protocol.md, Message features).
func (g *Gateway) edit(ctx context.Context, s *Session, req *wire.Request) {
	if len(req.Body) > g.cfg.MaxBody {
		g.answer(s, req, wire.Errorf(wire.TooLarge, "body is %d bytes; max_body is %d", len(req.Body), g.cfg.MaxBody), nil)
		return
	}
	res, err := g.deps.Log.Edit(ctx, req.Conv, s.user, s.device, req.Seq, req.Body, g.cfg.EditWindow)
	if err == nil {
		s.know(req.Conv, res.Seq)
	}
	g.answer(s, req, err, wire.EditOK{T: wire.TEditOK, Rid: req.Rid, Conv: req.Conv, Seq: res.Seq, Target: req.Seq})
}
