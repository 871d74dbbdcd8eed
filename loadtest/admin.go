package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Bulk call sizes: well under the admin API's MaxBulk, small enough that
// one call finishes in seconds.
const (
	bulkUsers = 5000
	bulkConvs = 1000
)

// Admin provisions through the admin API's bulk forms (docs/protocol.md §7,
// admin/admin.go).
type Admin struct {
	base  string
	token string
	hc    *http.Client
}

// NewAdmin returns a client of the admin API at base (http://host:port).
func NewAdmin(base, token string) *Admin {
	return &Admin{base: strings.TrimRight(base, "/"), token: token, hc: &http.Client{Timeout: 2 * time.Minute}}
}

// Device is a provisioned device with its one-time token.
type Device struct {
	ID    string `json:"id"`
	User  string `json:"user"`
	Token string `json:"token"`
}

// ConvSpec is one conversation to create.
type ConvSpec struct {
	ID      string   `json:"id,omitempty"`
	Kind    string   `json:"kind"`
	Members []string `json:"members"`
	Title   string   `json:"title,omitempty"`
}

// ConvCreated is the server's answer for one created conversation.
type ConvCreated struct {
	ID   string `json:"id"`
	Head int64  `json:"head"`
}

// APIError is a non-2xx reply of the admin API.
type APIError struct {
	Path   string
	Status int
	Code   string `json:"code"`
	Msg    string `json:"msg"`
}

func (e *APIError) Error() string {
	return fmt.Sprintf("admin %s: %d %s: %s", e.Path, e.Status, e.Code, e.Msg)
}

// post sends in as JSON and decodes a 2xx reply into out.
func (a *Admin) post(ctx context.Context, path string, in, out any) error {
	return a.call(ctx, http.MethodPost, path, in, out)
}

// call sends in as JSON with method and decodes a 2xx reply into out.
func (a *Admin) call(ctx context.Context, method, path string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.hc.Do(req)
	if err != nil {
		return fmt.Errorf("admin %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("admin %s: reading reply: %w", path, err)
	}
	if resp.StatusCode/100 != 2 {
		e := &APIError{Path: path, Status: resp.StatusCode}
		if json.Unmarshal(body, e) != nil {
			e.Msg = string(body)
		}
		return e
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			return fmt.Errorf("admin %s: decoding reply: %w", path, err)
		}
	}
	return nil
}

// Users creates users (POST /v1/bulk/users).
func (a *Admin) Users(ctx context.Context, ids []string) error {
	for chunk := range slices.Chunk(ids, bulkUsers) {
		if err := a.post(ctx, "/v1/bulk/users", map[string]any{"ids": chunk}, nil); err != nil {
			return err
		}
	}
	return nil
}

// Devices creates one device per (id, user) (POST /v1/bulk/devices) and
// returns them with their tokens, in order.
func (a *Admin) Devices(ctx context.Context, devs []Device) ([]Device, error) {
	out := make([]Device, 0, len(devs))
	for chunk := range slices.Chunk(devs, bulkUsers) {
		type dreq struct {
			ID   string `json:"id"`
			User string `json:"user"`
		}
		req := make([]dreq, len(chunk))
		for i, d := range chunk {
			req[i] = dreq{ID: d.ID, User: d.User}
		}
		var resp struct {
			Devices []Device `json:"devices"`
		}
		if err := a.post(ctx, "/v1/bulk/devices", map[string]any{"devices": req}, &resp); err != nil {
			return nil, err
		}
		if len(resp.Devices) != len(chunk) {
			return nil, fmt.Errorf("admin /v1/bulk/devices: %d devices for %d asked", len(resp.Devices), len(chunk))
		}
		out = append(out, resp.Devices...)
	}
	return out, nil
}

// Conversations creates conversations (POST /v1/bulk/conversations) and
// returns their ids, in order.
func (a *Admin) Conversations(ctx context.Context, specs []ConvSpec) ([]ConvCreated, error) {
	out := make([]ConvCreated, 0, len(specs))
	for chunk := range slices.Chunk(specs, bulkConvs) {
		var resp struct {
			Conversations []ConvCreated `json:"conversations"`
		}
		if err := a.post(ctx, "/v1/bulk/conversations", map[string]any{"conversations": chunk}, &resp); err != nil {
			return nil, err
		}
		if len(resp.Conversations) != len(chunk) {
			return nil, fmt.Errorf("admin /v1/bulk/conversations: %d for %d asked", len(resp.Conversations), len(chunk))
		}
		out = append(out, resp.Conversations...)
	}
	return out, nil
}

// SetRole gives user the role in the group conv (PUT
// /v1/conversations/{id}/members/{user}/role) and returns the seq of the
// update event it appended (the head if the user had that role already).
func (a *Admin) SetRole(ctx context.Context, conv, user, role string) (int64, error) {
	var resp struct {
		Seq int64 `json:"seq"`
	}
	path := "/v1/conversations/" + url.PathEscape(conv) + "/members/" + url.PathEscape(user) + "/role"
	if err := a.call(ctx, http.MethodPut, path, map[string]string{"role": role}, &resp); err != nil {
		return 0, err
	}
	return resp.Seq, nil
}
