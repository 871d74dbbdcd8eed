// Package admin is the admin HTTP API of docs/protocol.md §7: JSON over HTTP on
// its own listener, every request authorised by the admin bearer token.
// Operators, tests and the load tester provision users, devices and
// conversations through it; the bulk forms take thousands per call.
package admin

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/parley-im/parley/cursor"
	"github.com/parley-im/parley/errcode"
	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/fanout"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/wire"
)

// MaxBulk is the most items one bulk call takes.
const MaxBulk = 100000

// ModeFunc names the fan-out tier of a conversation with n members.
type ModeFunc func(n int64) string

// Notify tells every gateway of a device or user lifecycle change
// (fanout.Bus.Lifecycle).
type Notify func(ctx context.Context, l fanout.Lifecycle) error

// Withdraw takes devices' notification addresses out of use after a
// change that withdrew them was committed (notify.Notifier.Withdraw):
// when it returns nil, nothing more is sent to them by any process.
type Withdraw func(ctx context.Context, devices []string) error

// Connected returns which of user's devices have a live connection.
type Connected func(ctx context.Context, user string) (map[string]bool, error)

// API serves the admin endpoints.
type API struct {
	// Static after construction.
	notify      Notify
	withdraw    Withdraw
	userDevices Connected
	token       string
	st          *store.Store
	log         *eventlog.Log
	cursors     *cursor.Cursors
	mode        ModeFunc
	logger      *slog.Logger
	mux         *http.ServeMux
	// Set by Connected before serving (nil: devices read as not
	// connected).
	connected ConnectedFunc
}

// New returns the handler. notify carries lifecycle changes to the
// gateways; withdraw takes notification addresses out of use; connected
// answers GET /v1/users/{id}'s connected flags.
func New(token string, st *store.Store, log *eventlog.Log, cursors *cursor.Cursors, mode ModeFunc, notify Notify, withdraw Withdraw, connected Connected, logger *slog.Logger) *API {
	a := &API{token: token, st: st, log: log, cursors: cursors, mode: mode, notify: notify, withdraw: withdraw, userDevices: connected, logger: logger, mux: http.NewServeMux()}
	a.mux.HandleFunc("POST /v1/users", a.createUser)
	a.mux.HandleFunc("POST /v1/devices", a.createDevice)
	a.mux.HandleFunc("POST /v1/devices/{id}/reinstall", a.reinstall)
	a.mux.HandleFunc("DELETE /v1/devices/{id}", a.revokeDevice)
	a.mux.HandleFunc("POST /v1/devices/{id}/token", a.rotateToken)
	a.mux.HandleFunc("POST /v1/users/{id}/suspend", a.suspend)
	a.mux.HandleFunc("POST /v1/users/{id}/unsuspend", a.unsuspend)
	a.mux.HandleFunc("GET /v1/users/{id}", a.getUser)
	a.mux.HandleFunc("GET /v1/devices/{id}", a.getDevice)
	a.mux.HandleFunc("POST /v1/conversations", a.createConversation)
	a.mux.HandleFunc("POST /v1/conversations/{id}/members", a.addMembers)
	a.mux.HandleFunc("DELETE /v1/conversations/{id}/members/{user}", a.removeMember)
	a.mux.HandleFunc("GET /v1/conversations/{id}", a.getConversation)
	a.mux.HandleFunc("GET /v1/conversations/{id}/members", a.listMembers)
	a.mux.HandleFunc("PUT /v1/conversations/{id}/members/{user}/role", a.setRole)
	a.mux.HandleFunc("POST /v1/bulk/users", a.bulkUsers)
	a.mux.HandleFunc("POST /v1/bulk/devices", a.bulkDevices)
	a.mux.HandleFunc("POST /v1/bulk/conversations", a.bulkConversations)
	return a
}

// ServeHTTP checks the bearer token, then routes.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(a.token)) != 1 {
		writeError(w, http.StatusUnauthorized, wire.Unauthenticated, "missing or wrong admin token")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<20)
	h, pattern := a.mux.Handler(r)
	if pattern == "" {
		// No route: answer as every other error, in JSON (the mux's own
		// handler only decides between 404 and 405).
		rec := &statusRecorder{header: http.Header{}}
		h.ServeHTTP(rec, r)
		if allow := rec.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		if rec.status == http.StatusMethodNotAllowed {
			writeError(w, rec.status, wire.BadRequest, r.Method+" is not allowed on "+r.URL.Path)
			return
		}
		writeError(w, http.StatusNotFound, wire.NotFound, "no such endpoint: "+r.Method+" "+r.URL.Path)
		return
	}
	a.mux.ServeHTTP(w, r)
}

// statusRecorder keeps the status and headers a handler writes, and
// drops its body.
type statusRecorder struct {
	header http.Header
	status int
}

func (s *statusRecorder) Header() http.Header         { return s.header }
func (s *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (s *statusRecorder) WriteHeader(status int)      { s.status = status }

type userReq struct {
	ID string `json:"id"`
}

type deviceReq struct {
	ID   string `json:"id"`
	User string `json:"user"`
}

type deviceResp struct {
	ID           string `json:"id"`
	User         string `json:"user"`
	Token        string `json:"token"`
	InstallEpoch int64  `json:"install_epoch"`
}

type convReq struct {
	ID      string   `json:"id,omitempty"`
	Kind    string   `json:"kind"`
	Members []string `json:"members"`
	Title   string   `json:"title,omitempty"`
}

type convResp struct {
	ID   string `json:"id"`
	Head int64  `json:"head"`
}

func (a *API) createUser(w http.ResponseWriter, r *http.Request) {
	var req userReq
	if !decode(w, r, &req) {
		return
	}
	if err := validID(req.ID); err != nil {
		writeError(w, http.StatusBadRequest, wire.BadRequest, err.Error())
		return
	}
	if err := a.st.CreateUsers(r.Context(), []string{req.ID}); err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, req)
}

func (a *API) bulkUsers(w http.ResponseWriter, r *http.Request) {
	var req struct {
		IDs []string `json:"ids"`
	}
	if !decode(w, r, &req) {
		return
	}
	if len(req.IDs) == 0 || len(req.IDs) > MaxBulk {
		writeError(w, http.StatusBadRequest, wire.BadRequest, "ids: 1 to 100000 ids")
		return
	}
	for _, id := range req.IDs {
		if err := validID(id); err != nil {
			writeError(w, http.StatusBadRequest, wire.BadRequest, err.Error())
			return
		}
	}
	if err := a.st.CreateUsers(r.Context(), req.IDs); err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]int{"created": len(req.IDs)})
}

func (a *API) createDevice(w http.ResponseWriter, r *http.Request) {
	var req deviceReq
	if !decode(w, r, &req) {
		return
	}
	out, ok := a.newDevices(w, r, []deviceReq{req})
	if ok {
		writeJSON(w, http.StatusCreated, out[0])
	}
}

func (a *API) bulkDevices(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Devices []deviceReq `json:"devices"`
	}
	if !decode(w, r, &req) {
		return
	}
	if len(req.Devices) == 0 || len(req.Devices) > MaxBulk {
		writeError(w, http.StatusBadRequest, wire.BadRequest, "devices: 1 to 100000 devices")
		return
	}
	out, ok := a.newDevices(w, r, req.Devices)
	if ok {
		writeJSON(w, http.StatusCreated, map[string]any{"devices": out})
	}
}

// newDevices creates devices with fresh tokens; only the tokens' SHA-256
// is stored, the tokens themselves are shown once, here.
func (a *API) newDevices(w http.ResponseWriter, r *http.Request, reqs []deviceReq) ([]deviceResp, bool) {
	devs := make([]store.Device, len(reqs))
	out := make([]deviceResp, len(reqs))
	for i, d := range reqs {
		if err := validID(d.ID); err != nil {
			writeError(w, http.StatusBadRequest, wire.BadRequest, err.Error())
			return nil, false
		}
		if d.User == "" {
			writeError(w, http.StatusBadRequest, wire.BadRequest, "user is required")
			return nil, false
		}
		token, sum := newToken()
		devs[i] = store.Device{ID: d.ID, User: d.User, TokenSHA256: sum}
		out[i] = deviceResp{ID: d.ID, User: d.User, Token: token}
	}
	if err := a.st.CreateDevices(r.Context(), devs); err != nil {
		a.fail(w, r, err)
		return nil, false
	}
	return out, true
}

// newToken returns a fresh static device token and its SHA-256.
func newToken() (string, []byte) {
	var raw [24]byte
	_, _ = rand.Read(raw[:])
	token := hex.EncodeToString(raw[:])
	sum := sha256.Sum256([]byte(token))
	return token, sum[:]
}

func (a *API) reinstall(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	dev, err := a.st.DeviceByID(r.Context(), id)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	epoch, err := a.st.Reinstall(r.Context(), id)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if err := a.cursors.Forget(r.Context(), dev.User, id); err != nil {
		a.logger.Warn("forgetting hot cursors after reinstall", "device", id, "err", err)
	}
	// The old install's registration was deleted with it.
	if err := a.withdrawAddresses(r.Context(), id); err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "install_epoch": epoch})
}

func (a *API) createConversation(w http.ResponseWriter, r *http.Request) {
	var req convReq
	if !decode(w, r, &req) {
		return
	}
	c, err := newConversation(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, wire.BadRequest, err.Error())
		return
	}
	if err := a.log.Create(r.Context(), c); err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, convResp{ID: c.ID, Head: 1})
}

// bulkConversations creates every conversation asked for, or none.
func (a *API) bulkConversations(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Conversations []convReq `json:"conversations"`
	}
	if !decode(w, r, &req) {
		return
	}
	if len(req.Conversations) == 0 || len(req.Conversations) > MaxBulk {
		writeError(w, http.StatusBadRequest, wire.BadRequest, "conversations: 1 to 100000 conversations")
		return
	}
	cs := make([]store.NewConversation, len(req.Conversations))
	out := make([]convResp, len(req.Conversations))
	for i, cr := range req.Conversations {
		c, err := newConversation(cr)
		if err != nil {
			writeError(w, http.StatusBadRequest, wire.BadRequest, fmt.Sprintf("conversations[%d]: %v", i, err))
			return
		}
		cs[i], out[i] = c, convResp{ID: c.ID, Head: 1}
	}
	if err := a.log.Create(r.Context(), cs...); err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"conversations": out})
}

// newConversation checks req and gives it its id.
func newConversation(req convReq) (store.NewConversation, error) {
	members := slices.Compact(slices.Sorted(slices.Values(req.Members)))
	id := req.ID
	switch req.Kind {
	case "direct":
		if len(members) != 2 {
			return store.NewConversation{}, errors.New("direct takes exactly two members")
		}
		id = eventlog.DirectID(members[0], members[1])
	case "group":
		if id == "" {
			id = eventlog.NewGroupID()
		} else if err := eventlog.ValidGroupID(id); err != nil {
			return store.NewConversation{}, err
		}
		if len(members) == 0 {
			return store.NewConversation{}, errors.New("members is required")
		}
	default:
		return store.NewConversation{}, errors.New("kind must be group or direct")
	}
	return store.NewConversation{ID: id, Kind: req.Kind, Title: req.Title, Members: members}, nil
}

func (a *API) addMembers(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Users []string `json:"users"`
	}
	if !decode(w, r, &req) {
		return
	}
	if len(req.Users) == 0 {
		writeError(w, http.StatusBadRequest, wire.BadRequest, "users is required")
		return
	}
	head, err := a.log.AddMembers(r.Context(), r.PathValue("id"), "", "", req.Users)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"head": head})
}

func (a *API) removeMember(w http.ResponseWriter, r *http.Request) {
	head, err := a.log.RemoveMember(r.Context(), r.PathValue("id"), "", "", r.PathValue("user"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"head": head})
}

func (a *API) getConversation(w http.ResponseWriter, r *http.Request) {
	c, err := a.st.ConversationByID(r.Context(), r.PathValue("id"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": c.ID, "kind": c.Kind, "title": c.Title, "head": c.Head,
		"members": c.Members, "mode": a.mode(c.Members)})
}

// listMembers lists a conversation's current members with their roles
// and mutes in force.
func (a *API) listMembers(w http.ResponseWriter, r *http.Request) {
	ms, err := a.st.Members(r.Context(), r.PathValue("id"), time.Now().UnixMilli())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	type member struct {
		User       string `json:"user"`
		Role       string `json:"role"`
		MutedUntil int64  `json:"muted_until,omitempty"`
		FromSeq    int64  `json:"from_seq"`
	}
	out := make([]member, len(ms))
	for i, m := range ms {
		out[i] = member{User: m.User, Role: m.Role.String(), MutedUntil: m.MutedUntil, FromSeq: m.FromSeq}
	}
	writeJSON(w, http.StatusOK, map[string]any{"members": out})
}

// setRole gives a current member a role as the operator: not subject to
// the owner-only rule (an admin API-created group has no owner until one
// is set here); giving "owner" transfers ownership.
func (a *API) setRole(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Role string `json:"role"`
	}
	if !decode(w, r, &req) {
		return
	}
	role, ok := store.ParseRole(req.Role)
	if !ok {
		writeError(w, http.StatusBadRequest, wire.BadRequest, `role must be "owner", "admin" or "member"`)
		return
	}
	res, err := a.log.SetRole(r.Context(), r.PathValue("id"), "", "", r.PathValue("user"), role)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"seq": res.Seq})
}

// fail answers a failed request with the code and status of the table
// shared with the wire requests (package errcode): the client's own
// mistakes with their 4xx code; a backend that is down 503 UNAVAILABLE;
// anything else is a bug: 500 INTERNAL, logged with the request.
func (a *API) fail(w http.ResponseWriter, r *http.Request, err error) {
	code, status, class := errcode.Admin(err)
	switch class {
	case errcode.Outage:
		a.logger.Warn("admin request failed: backend unavailable", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, status, code, "a backend is unavailable; retry later")
	case errcode.Bug:
		a.logger.Error("admin request failed: internal error", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, status, code, "internal error")
	default:
		writeError(w, status, code, err.Error())
	}
}

func validID(id string) error {
	if id == "" || len(id) > 128 || strings.ContainsAny(id, "{}|") {
		return errors.New("id must be 1 to 128 bytes without { } |")
	}
	return nil
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, wire.BadRequest, "malformed JSON body: "+err.Error())
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code wire.Code, msg string) {
	writeJSON(w, status, map[string]string{"code": string(code), "msg": msg})
}
