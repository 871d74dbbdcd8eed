package admin

import (
	"context"
	"net/http"
	"time"

	"github.com/parley-im/parley/fanout"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/wire"
)

// notifyTimeout bounds the publication of a lifecycle notice.
const notifyTimeout = 2 * time.Second

// revokeDevice: DELETE /v1/devices/{id}. The device's token and any JWT
// naming it fail from now on; its connections, on every gateway, are
// kicked ("revoked"); its notification registration is deleted and,
// once this is answered, nothing more is sent to it. Its user, read
// positions and messages stay.
func (a *API) revokeDevice(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	user, err := a.st.RevokeDevice(r.Context(), id)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	err = a.withdrawAddresses(r.Context(), id)
	a.announce(r, fanout.Lifecycle{Device: id, User: user, Reason: wire.KickRevoked})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": id})
}

// rotateToken: POST /v1/devices/{id}/token. A new static token, shown
// once; the old one fails from now on and live connections are kicked
// ("revoked").
func (a *API) rotateToken(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	token, sum := newToken()
	user, err := a.st.RotateToken(r.Context(), id, sum)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.announce(r, fanout.Lifecycle{Device: id, User: user, Reason: wire.KickRevoked})
	writeJSON(w, http.StatusOK, map[string]string{"id": id, "token": token})
}

func (a *API) suspend(w http.ResponseWriter, r *http.Request)   { a.setSuspended(w, r, true) }
func (a *API) unsuspend(w http.ResponseWriter, r *http.Request) { a.setSuspended(w, r, false) }

// setSuspended: POST /v1/users/{id}/suspend and /unsuspend. A suspended
// user's connections are kicked ("suspended") and auth answers SUSPENDED;
// once a suspension is answered nothing more is sent to the user's
// devices' notification addresses (kept, for when the user is
// unsuspended); admin calls that add the user to conversations still
// work.
func (a *API) setSuspended(w http.ResponseWriter, r *http.Request, suspended bool) {
	id := r.PathValue("id")
	if err := a.st.SetSuspended(r.Context(), id, suspended); err != nil {
		a.fail(w, r, err)
		return
	}
	var err error
	if suspended {
		var regs []store.Registration
		if regs, err = a.st.UserRegistrations(r.Context(), id); err == nil {
			devices := make([]string, len(regs))
			for i, g := range regs {
				devices[i] = g.Device
			}
			err = a.withdrawAddresses(r.Context(), devices...)
		}
	}
	reason := "unsuspended"
	if suspended {
		reason = wire.KickSuspended
	}
	a.announce(r, fanout.Lifecycle{User: id, Reason: reason})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "suspended": suspended})
}

// withdrawAddresses takes the devices' notification addresses out of use
// (their change is committed): a failure leaves the request unanswered
// as done (UNAVAILABLE), and repeating it withdraws them again.
func (a *API) withdrawAddresses(ctx context.Context, devices ...string) error {
	if a.withdraw == nil || len(devices) == 0 {
		return nil
	}
	return a.withdraw(ctx, devices)
}

// announce tells every gateway of a change already committed. If the
// notice cannot be published, the change still holds (every later auth
// reads it, and a refresh checks it), so the call succeeds, and the
// failure is logged.
func (a *API) announce(r *http.Request, l fanout.Lifecycle) {
	if a.notify == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), notifyTimeout)
	defer cancel()
	if err := a.notify(ctx, l); err != nil {
		a.logger.Error("publishing a lifecycle notice: live connections keep running until they reconnect or refresh",
			"device", l.Device, "user", l.User, "reason", l.Reason, "err", err)
	}
}

type userDevice struct {
	ID           string `json:"id"`
	Connected    bool   `json:"connected"`
	InstallEpoch int64  `json:"install_epoch"`
}

// getUser: GET /v1/users/{id}: {id, suspended, devices:[{id, connected,
// install_epoch}]}, revoked devices left out.
func (a *API) getUser(w http.ResponseWriter, r *http.Request) {
	u, err := a.st.UserByID(r.Context(), r.PathValue("id"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	var online map[string]bool
	if a.connected != nil {
		if online, err = a.userDevices(r.Context(), u.ID); err != nil {
			a.fail(w, r, err)
			return
		}
	}
	devs := make([]userDevice, len(u.Devices))
	for i, d := range u.Devices {
		devs[i] = userDevice{ID: d.ID, Connected: online[d.ID], InstallEpoch: d.InstallEpoch}
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": u.ID, "suspended": u.Suspended, "devices": devs})
}
