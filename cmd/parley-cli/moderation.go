package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/parley-im/parley/wire"
)

// updateResult is the reply of role, mute-member, ban, unban and
// conv-update: the update event's seq (the head if nothing changed),
// and what was asked.
type updateResult struct {
	Conv       string  `json:"conv"`
	Seq        int64   `json:"seq"`
	User       string  `json:"user,omitempty"`
	Role       string  `json:"role,omitempty"`
	MutedUntil *int64  `json:"muted_until,omitempty"`
	Banned     *bool   `json:"banned,omitempty"`
	Title      *string `json:"title,omitempty"`
	Invite     string  `json:"invite,omitempty"`
}

func (r *updateResult) text(*session) string {
	var what []string
	switch {
	case r.Role != "":
		what = append(what, r.User+" is "+r.Role)
	case r.MutedUntil != nil && *r.MutedUntil == 0:
		what = append(what, r.User+" unmuted")
	case r.MutedUntil != nil:
		what = append(what, r.User+" muted until "+time.UnixMilli(*r.MutedUntil).Format(time.DateTime))
	case r.Banned != nil && *r.Banned:
		what = append(what, r.User+" banned")
	case r.Banned != nil:
		what = append(what, r.User+" unbanned")
	}
	if r.Title != nil {
		what = append(what, fmt.Sprintf("title %q", *r.Title))
	}
	if r.Invite != "" {
		what = append(what, "invite "+r.Invite)
	}
	return fmt.Sprintf("%s: %s (seq %d)", r.Conv, strings.Join(what, ", "), r.Seq)
}

func cmdRole(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	if len(args) != 3 {
		return nil, needUsage()
	}
	if !wire.ValidRole(args[2]) {
		return nil, usagef("ROLE: owner, admin or member")
	}
	r, err := s.c.SetRole(ctx, args[0], args[1], args[2])
	if err != nil {
		return nil, err
	}
	return &updateResult{Conv: args[0], Seq: r.Seq, User: args[1], Role: args[2]}, nil
}

type removeResult struct {
	Conv  string   `json:"conv"`
	Users []string `json:"users"`
	Head  int64    `json:"head"`
}

func (r *removeResult) text(*session) string {
	return fmt.Sprintf("removed from %s: %s (head %d)", r.Conv, strings.Join(r.Users, ", "), r.Head)
}

func cmdRemove(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	if len(args) < 2 {
		return nil, needUsage()
	}
	r, err := s.c.RemoveMembers(ctx, args[0], args[1:]...)
	if err != nil {
		return nil, err
	}
	return &removeResult{Conv: args[0], Users: args[1:], Head: r.Head}, nil
}

func cmdMuteMember(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	if len(args) != 3 {
		return nil, needUsage()
	}
	d, err := time.ParseDuration(args[2])
	if err != nil || d < 0 {
		return nil, usagef("DURATION: a duration such as 10m or 1h (0 unmutes)")
	}
	until := int64(0)
	if d > 0 {
		until = time.Now().Add(d).UnixMilli()
	}
	r, err := s.c.MuteMember(ctx, args[0], args[1], until)
	if err != nil {
		return nil, err
	}
	return &updateResult{Conv: args[0], Seq: r.Seq, User: args[1], MutedUntil: &until}, nil
}

func cmdBan(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	return banOrUnban(ctx, s, cl, true)
}

func cmdUnban(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	return banOrUnban(ctx, s, cl, false)
}

func banOrUnban(ctx context.Context, s *session, cl *cmdLine, ban bool) (result, error) {
	args := cl.args()
	if len(args) != 2 {
		return nil, needUsage()
	}
	f := s.c.Unban
	if ban {
		f = s.c.Ban
	}
	r, err := f(ctx, args[0], args[1])
	if err != nil {
		return nil, err
	}
	return &updateResult{Conv: args[0], Seq: r.Seq, User: args[1], Banned: &ban}, nil
}

// cmdConvUpdate parses "CONV [-title TEXT] [-invite all|admins]", in
// either order. TEXT is the rest of the line up to a word -invite, as
// typed; -title with nothing after it clears the title.
func cmdConvUpdate(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	if len(args) < 2 {
		return nil, needUsage()
	}
	var title *string
	invite := ""
	for i := 1; i < len(args); {
		switch args[i] {
		case "-title":
			if title != nil {
				return nil, needUsage()
			}
			end := i + 1
			for end < len(args) && args[end] != "-invite" {
				end++
			}
			t := ""
			if end > i+1 {
				from, to := cl.offs[i+2], len(cl.line)
				if end < len(args) {
					to = cl.offs[end+1]
				}
				t = strings.TrimSpace(cl.line[from:to])
			}
			title, i = &t, end
		case "-invite":
			if invite != "" || i+1 == len(args) {
				return nil, needUsage()
			}
			if invite = args[i+1]; !wire.ValidInvite(invite) {
				return nil, usagef("-invite: all or admins")
			}
			i += 2
		default:
			return nil, needUsage()
		}
	}
	r, err := s.c.UpdateConv(ctx, args[0], title, invite)
	if err != nil {
		return nil, err
	}
	return &updateResult{Conv: args[0], Seq: r.Seq, Title: title, Invite: invite}, nil
}
