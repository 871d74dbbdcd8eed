package conn

import (
	"context"
	"time"

	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/wire"
)

// Notifications is what the gateway needs of offline notifications
// (package notify).
type Notifications interface {
	// Has reports whether the server can send through provider (it has
	// its credentials).
	Has(provider string) bool
	// ReadAdvanced tells that user's read position advanced somewhere:
	// their devices that were notified may need a new badge. It must not
	// block.
	ReadAdvanced(user string)
}

// notifyRegister stores the device's notification address (replacing any
// earlier one). A provider the server has no credentials for is refused
// like an unknown one: notifications through it could never be sent.
func (g *Gateway) notifyRegister(ctx context.Context, s *Session, req *wire.Request) {
	if g.deps.Notifications == nil || !g.deps.Notifications.Has(req.Provider) {
		g.answer(s, req, wire.Errorf(wire.BadRequest, "provider: this server has no credentials for %s", req.Provider), nil)
		return
	}
	err := g.deps.Store.RegisterNotify(ctx, store.Registration{Device: s.device, User: s.user, Provider: req.Provider,
		Token: req.Token, Sandbox: req.Sandbox, RegisteredAt: time.Now().UnixMilli()})
	g.answer(s, req, err, wire.NotifyRegisterOK{T: wire.TNotifyRegisterOK, Rid: req.Rid})
}
