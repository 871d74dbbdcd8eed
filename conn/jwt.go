package conn

import (
	"context"
	"errors"
	"time"

	"github.com/parley-im/parley/jwtauth"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/wire"
)

// Results of an auth or refresh, the result label of parley_gateway_auths_total.
const (
	authOK          = "ok"
	authProvisioned = "provisioned"   // ok, and the JWT created the user or device
	authBadToken    = "bad_token"     // unknown device or wrong static token
	authBadJWT      = "bad_jwt"       // malformed, wrongly signed, bad claims, alg none, unknown key
	authTooLarge    = "too_large"     // a JWT over 8 KiB
	authExpired     = "expired"       // a JWT past exp (and the leeway)
	authJWTOff      = "jwt_off"       // a JWT while no JWT key is configured
	authUnknown     = "unknown"       // a valid JWT of a device that does not exist, auto-provision off
	authOtherUser   = "other_user"    // a JWT naming a device of another user
	authOtherDevice = "other_device"  // refresh: a JWT of another user or device than the connection's
	authNotJWT      = "not_jwt"       // refresh on a connection authenticated by a static token
	authRevoked     = "revoked"       // the device is revoked
	authSuspended   = "suspended"     // the user is suspended
	authBackend     = "backend_error" // a store failed
)

// checkJWT verifies an auth's JWT and finds (or creates) its device. It
// returns the device and the token's exp, or the error to refuse the auth
// with and the result to count.
func (g *Gateway) checkJWT(ctx context.Context, s *Session, req *wire.Request) (store.Device, time.Time, string, *wire.Error) {
	c, err := g.deps.JWT.Verify(ctx, req.JWT)
	if err != nil {
		result, we := jwtError(err)
		return store.Device{}, time.Time{}, result, we
	}
	found, err := g.lookups.Do(ctx, c.Device)
	if err != nil {
		return store.Device{}, time.Time{}, authBackend, g.wireError(s, req, err)
	}
	result := authOK
	if !found.found {
		if !g.cfg.JWTAutoProvision {
			return store.Device{}, time.Time{}, authUnknown, wire.Errorf(wire.AuthFailed, "unknown device")
		}
		// Created together with the other first logins arriving meanwhile;
		// a concurrent first login of the same device creates nothing more.
		if found, err = g.provisions.Do(ctx, store.NewLogin{User: c.User, Device: c.Device}); err != nil {
			return store.Device{}, time.Time{}, authBackend, g.wireError(s, req, err)
		}
		if !found.found {
			return store.Device{}, time.Time{}, authBadJWT, wire.Errorf(wire.AuthFailed, "the token's ids cannot be stored")
		}
		result = authProvisioned
	}
	dev := found.dev
	switch {
	case dev.User != c.User:
		return dev, time.Time{}, authOtherUser, wire.Errorf(wire.AuthFailed, "the device belongs to another user")
	case dev.Revoked:
		return dev, time.Time{}, authRevoked, wire.Errorf(wire.AuthFailed, "the device is revoked")
	case dev.Suspended:
		return dev, time.Time{}, authSuspended, wire.Errorf(wire.Suspended, "the user is suspended")
	}
	return dev, c.Expires, result, nil
}

// jwtError maps a verification error to its result and wire error.
func jwtError(err error) (string, *wire.Error) {
	switch {
	case errors.Is(err, jwtauth.ErrExpired):
		return authExpired, wire.Errorf(wire.TokenExpired, "the token has expired")
	case errors.Is(err, jwtauth.ErrTooLong):
		return authTooLarge, wire.Errorf(wire.AuthFailed, "the token is longer than 8 KiB")
	case errors.Is(err, jwtauth.ErrNoKeys):
		return authJWTOff, wire.Errorf(wire.AuthFailed, "JWT auth is not configured on this server")
	}
	return authBadJWT, wire.Errorf(wire.AuthFailed, "invalid token")
}

// refresh extends a JWT-authenticated connection's life to the exp of a
// new token of the same user and device. A refused refresh leaves the
// connection open (it still closes at its current exp).
func (g *Gateway) refresh(ctx context.Context, s *Session, req *wire.Request) {
	result, we := g.checkRefresh(ctx, s, req)
	g.metrics.auths.WithLabelValues("refresh", result).Inc()
	if we != nil {
		g.answer(s, req, we, nil)
		return
	}
	g.answer(s, req, nil, wire.RefreshOK{T: wire.TRefreshOK, Rid: req.Rid, ExpiresAt: s.expiresAt.Load()})
}

func (g *Gateway) checkRefresh(ctx context.Context, s *Session, req *wire.Request) (string, *wire.Error) {
	if !s.jwt {
		return authNotJWT, wire.Errorf(wire.AuthFailed, "this connection authenticated with a static token; it does not expire")
	}
	c, err := g.deps.JWT.Verify(ctx, req.JWT)
	if err != nil {
		return jwtError(err)
	}
	if c.User != s.user || c.Device != s.device {
		return authOtherDevice, wire.Errorf(wire.AuthFailed, "the token names another user or device than this connection's")
	}
	// The device's row again: a revocation or suspension whose notice this
	// gateway missed still ends the session here.
	found, err := g.lookups.Do(ctx, c.Device)
	if err != nil {
		return authBackend, g.wireError(s, req, err)
	}
	switch {
	case !found.found || found.dev.Revoked || found.dev.User != s.user:
		s.kickOut(wire.KickRevoked)
		g.metrics.kicks.WithLabelValues(wire.KickRevoked).Inc()
		return authRevoked, wire.Errorf(wire.AuthFailed, "the device is revoked")
	case found.dev.Suspended:
		s.kickOut(wire.KickSuspended)
		g.metrics.kicks.WithLabelValues(wire.KickSuspended).Inc()
		return authSuspended, wire.Errorf(wire.Suspended, "the user is suspended")
	}
	s.expireAt(c.Expires)
	return authOK, nil
}

// expireAt sets when the connection's JWT expires: at that instant (no
// leeway) it is kicked ("expired") unless a refresh moved it.
func (s *Session) expireAt(exp time.Time) {
	s.emu.Lock()
	defer s.emu.Unlock()
	s.expiresAt.Store(exp.UnixMilli())
	if s.expTimer != nil {
		s.expTimer.Stop()
	}
	if s.closed.Load() {
		return // OnClose stopped the timer already; keep no new one
	}
	s.expTimer = time.AfterFunc(time.Until(exp), s.checkExpiry)
}

// expired reports whether the connection's JWT has expired at now.
func (s *Session) expired(now time.Time) bool {
	e := s.expiresAt.Load()
	return e != 0 && now.UnixMilli() >= e
}

// checkExpiry kicks the connection if its JWT has expired (a timer that a
// refresh replaced finds it has not).
func (s *Session) checkExpiry() {
	if s.expired(time.Now()) && !s.closing.Load() {
		s.g.metrics.kicks.WithLabelValues(wire.KickExpired).Inc()
		s.kickOut(wire.KickExpired)
	}
}

// stopExpiry stops the expiry timer of a closed connection.
func (s *Session) stopExpiry() {
	s.emu.Lock()
	if s.expTimer != nil {
		s.expTimer.Stop()
	}
	s.emu.Unlock()
}
