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
	// Withdraw takes the devices' notification addresses out of use
	// after a change that withdrew them was committed; when it returns
	// nil, nothing more is sent to them, by any process.
	Withdraw(ctx context.Context, devices []string) error
}

// notifyRegister stores the device's notification address (replacing any
// earlier one). A provider the server has no credentials for is refused
// like an unknown one: notifications through it could never be sent.
func (g *Gateway) notifyRegister(ctx context.Context, s *Session, req *wire.Request) {
	if g.deps.Notifications == nil || !g.deps.Notifications.Has(req.Provider) {
		g.answer(s, req, wire.Errorf(wire.BadRequest, "provider: this server has no credentials for %s", req.Provider), nil)
		return
	}
	replaced, err := g.deps.Store.RegisterNotify(ctx, store.Registration{Device: s.device, User: s.user, Provider: req.Provider,
		Token: req.Token, Sandbox: req.Sandbox, RegisteredAt: time.Now().UnixMilli()})
	if err == nil && replaced {
		// Nothing more goes to the old token once this is answered.
		err = g.deps.Notifications.Withdraw(ctx, []string{s.device})
	}
	g.answer(s, req, err, wire.NotifyRegisterOK{T: wire.TNotifyRegisterOK, Rid: req.Rid})
}

// notifyUnregister deletes the device's notification address; once it is
// answered nothing more is sent to it.
func (g *Gateway) notifyUnregister(ctx context.Context, s *Session, req *wire.Request) {
	err := g.deps.Store.UnregisterNotify(ctx, s.device)
	if err == nil && g.deps.Notifications != nil {
		err = g.deps.Notifications.Withdraw(ctx, []string{s.device})
	}
	g.answer(s, req, err, wire.NotifyUnregisterOK{T: wire.TNotifyUnregisterOK, Rid: req.Rid})
}
