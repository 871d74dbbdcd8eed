package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// runAdmin is `parley-cli admin …`: the admin HTTP API (docs/protocol.md §7),
// enough to try Parley with nothing else.
func runAdmin(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("parley-cli admin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	base := fs.String("admin", envOr("PARLEY_ADMIN_URL", "http://127.0.0.1:8081"), "admin API `URL` ($PARLEY_ADMIN_URL)")
	token := fs.String("token", os.Getenv("PARLEY_ADMIN_TOKEN"), "admin `token` ($PARLEY_ADMIN_TOKEN)")
	asJSON := fs.Bool("json", false, "print the API's JSON reply as is")
	timeout := fs.Duration("timeout", 10*time.Second, "request timeout")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `parley-cli admin [flags] COMMAND ARGS: the admin API.

  user ID                     create a user
  device ID USER              create a device of USER; prints its token
  group ID|- MEMBER...        create a group (-: the server picks the id)
  conv ID                     show a conversation (kind, head, members, mode)
  members CONV                list a conversation's members: role, muted until, from seq
  role CONV USER ROLE         give a member a role (owner, admin, member): how an
                              admin-made group gets its owner
  show-user ID                show a user: suspended?, devices, which are connected
  revoke DEVICE               revoke a device (its connections are kicked; for good)
  rotate DEVICE               give a device a new token (printed; the old one fails)
  suspend USER, unsuspend USER

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	bad := func(msg string) int {
		fmt.Fprintln(stderr, "parley-cli admin: "+msg)
		return exitUsage
	}
	if *token == "" {
		return bad("-token (or $PARLEY_ADMIN_TOKEN) is required: the admin token parleyd printed at start")
	}
	a := fs.Args()
	if len(a) == 0 {
		return bad("a COMMAND is needed (user, device, group, conv, members, role, …); try -h")
	}
	var method, path string
	var body any
	switch a[0] {
	case "user":
		if len(a) != 2 {
			return bad("usage: user ID")
		}
		method, path, body = "POST", "/v1/users", map[string]string{"id": a[1]}
	case "device":
		if len(a) != 3 {
			return bad("usage: device ID USER")
		}
		method, path, body = "POST", "/v1/devices", map[string]string{"id": a[1], "user": a[2]}
	case "group":
		if len(a) < 2 {
			return bad("usage: group ID|- MEMBER...")
		}
		req := map[string]any{"kind": "group", "members": append([]string{}, a[2:]...)}
		if a[1] != "-" {
			req["id"] = a[1]
		}
		method, path, body = "POST", "/v1/conversations", req
	case "conv":
		if len(a) != 2 {
			return bad("usage: conv ID")
		}
		method, path = "GET", "/v1/conversations/"+url.PathEscape(a[1])
	case "members":
		if len(a) != 2 {
			return bad("usage: members CONV")
		}
		method, path = "GET", "/v1/conversations/"+url.PathEscape(a[1])+"/members"
	case "role":
		if len(a) != 4 {
			return bad("usage: role CONV USER owner|admin|member")
		}
		method, path, body = "PUT", "/v1/conversations/"+url.PathEscape(a[1])+"/members/"+url.PathEscape(a[2])+"/role", map[string]string{"role": a[3]}
	case "show-user", "revoke", "rotate", "suspend", "unsuspend":
		if len(a) != 2 {
			return bad("usage: " + a[0] + " ID")
		}
		id := url.PathEscape(a[1])
		call := map[string][2]string{
			"show-user": {"GET", "/v1/users/" + id},
			"revoke":    {"DELETE", "/v1/devices/" + id},
			"rotate":    {"POST", "/v1/devices/" + id + "/token"},
			"suspend":   {"POST", "/v1/users/" + id + "/suspend"},
			"unsuspend": {"POST", "/v1/users/" + id + "/unsuspend"},
		}[a[0]]
		method, path = call[0], call[1]
	default:
		return bad(fmt.Sprintf("unknown command %q (user, device, group, conv, members, role, show-user, revoke, rotate, suspend, unsuspend)", a[0]))
	}

	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	status, reply, err := adminCall(ctx, strings.TrimRight(*base, "/"), *token, method, path, body)
	if err != nil {
		if *asJSON {
			fmt.Fprintln(stdout, jsonLine(errorJSON{Error: "UNREACHABLE", Msg: err.Error()}))
		} else {
			fmt.Fprintln(stderr, "parley-cli admin:", err)
		}
		return exitUnreachable
	}
	if status >= 300 {
		var e struct{ Code, Msg string }
		if json.Unmarshal(reply, &e) != nil || e.Code == "" {
			e.Code, e.Msg = "INTERNAL", fmt.Sprintf("HTTP %d: %s", status, bytes.TrimSpace(reply))
		}
		if *asJSON {
			fmt.Fprintln(stdout, jsonLine(errorJSON{Error: e.Code, Msg: e.Msg}))
		} else {
			fmt.Fprintf(stderr, "parley-cli admin: %s: %s\n", e.Code, e.Msg)
		}
		return exitRefused
	}
	if *asJSON {
		fmt.Fprintln(stdout, string(bytes.TrimSpace(reply)))
		return exitOK
	}
	var r struct {
		ID, User, Token, Kind, Title, Mode string
		Head, Seq                          int64
		Members                            json.RawMessage // a count (conv), or a list (members)
		Suspended                          bool
		Devices                            []struct {
			ID           string
			Connected    bool
			InstallEpoch int64 `json:"install_epoch"`
		}
	}
	_ = json.Unmarshal(reply, &r)
	switch a[0] {
	case "user":
		fmt.Fprintf(stdout, "created user %s\n", r.ID)
	case "device":
		// The token alone on stdout, so that TOKEN=$(parley-cli admin device …) works.
		fmt.Fprintln(stdout, r.Token)
		fmt.Fprintf(stderr, "created device %s of %s (the token is shown once). Connect with:\n  parley-cli -device %s -token %s\n",
			r.ID, r.User, r.ID, r.Token)
	case "group":
		fmt.Fprintf(stdout, "created group %s (head %d)\n", r.ID, r.Head)
	case "conv":
		var n int64
		_ = json.Unmarshal(r.Members, &n)
		fmt.Fprintf(stdout, "%s: %s, head %d, %d members, mode %s\n", r.ID, r.Kind, r.Head, n, r.Mode)
	case "members":
		var ms []struct {
			User, Role string
			MutedUntil int64 `json:"muted_until"`
			FromSeq    int64 `json:"from_seq"`
		}
		_ = json.Unmarshal(r.Members, &ms)
		fmt.Fprintf(stdout, "%s: %d members\n", a[1], len(ms))
		for _, m := range ms {
			muted := ""
			if m.MutedUntil > 0 {
				muted = "  muted until " + time.UnixMilli(m.MutedUntil).Format(time.DateTime)
			}
			fmt.Fprintf(stdout, "  %s  %s  from #%d%s\n", m.User, m.Role, m.FromSeq, muted)
		}
	case "role":
		fmt.Fprintf(stdout, "%s: %s is %s (seq %d)\n", a[1], a[2], a[3], r.Seq)
	case "show-user":
		fmt.Fprintf(stdout, "%s: suspended %v, %d devices\n", r.ID, r.Suspended, len(r.Devices))
		for _, d := range r.Devices {
			fmt.Fprintf(stdout, "  %s  connected %v  install_epoch %d\n", d.ID, d.Connected, d.InstallEpoch)
		}
	case "revoke":
		fmt.Fprintf(stdout, "revoked device %s\n", r.ID)
	case "rotate":
		fmt.Fprintln(stdout, r.Token) // alone on stdout, as for device
		fmt.Fprintf(stderr, "new token of device %s (shown once; the old one fails from now on)\n", r.ID)
	case "suspend", "unsuspend":
		fmt.Fprintf(stdout, "user %s: suspended %v\n", r.ID, r.Suspended)
	}
	return exitOK
}

func adminCall(ctx context.Context, base, token, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return resp.StatusCode, b, err
}
