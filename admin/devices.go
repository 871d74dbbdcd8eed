package admin

import (
	"context"
	"net/http"
)

// ConnectedFunc reports whether device (of user) has a live connection on
// any gateway.
type ConnectedFunc func(ctx context.Context, user, device string) (bool, error)

// Connected sets how GET /v1/devices/{id} tells whether a device is
// connected; call it before serving.
func (a *API) Connected(f ConnectedFunc) { a.connected = f }

// deviceNotify is a device's registration as GET /v1/devices/{id} shows it.
type deviceNotify struct {
	Provider     string `json:"provider"`
	RegisteredAt int64  `json:"registered_at"`
}

// getDevice: {id, user, install_epoch, connected, notify: {provider, registered_at} | null}.
func (a *API) getDevice(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	dev, err := a.st.DeviceByID(r.Context(), id)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	regs, err := a.st.NotifyRegistrations(r.Context(), []string{id})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	var notify *deviceNotify
	if reg, ok := regs[id]; ok {
		notify = &deviceNotify{Provider: reg.Provider, RegisteredAt: reg.RegisteredAt}
	}
	connected := false
	if a.connected != nil {
		if connected, err = a.connected(r.Context(), dev.User, id); err != nil {
			a.fail(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "user": dev.User, "install_epoch": dev.InstallEpoch,
		"connected": connected, "notify": notify})
}
