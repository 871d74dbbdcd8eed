package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

type notifyResult struct {
	Provider   string `json:"provider,omitempty"`
	Registered bool   `json:"registered"`
}

func (r *notifyResult) text(*session) string {
	if !r.Registered {
		return "notifications: unregistered"
	}
	return "notifications: registered with " + r.Provider
}

func cmdNotify(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	switch {
	case len(args) == 1 && args[0] == "unregister":
		if _, err := s.c.NotifyUnregister(ctx); err != nil {
			return nil, err
		}
		return &notifyResult{}, nil
	case (len(args) == 3 || len(args) == 4 && args[3] == "sandbox") && args[0] == "register":
		if _, err := s.c.NotifyRegister(ctx, args[1], args[2], len(args) == 4); err != nil {
			return nil, err
		}
		return &notifyResult{Provider: args[1], Registered: true}, nil
	}
	return nil, needUsage()
}

type muteResult struct {
	Conv       string `json:"conv"`
	MutedUntil int64  `json:"muted_until"`
}

func (r *muteResult) text(*session) string {
	if r.MutedUntil == 0 {
		return r.Conv + ": unmuted"
	}
	return fmt.Sprintf("%s: muted until %s", r.Conv, time.UnixMilli(r.MutedUntil).Format(time.DateTime))
}

func cmdMute(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	if len(args) != 2 {
		return nil, needUsage()
	}
	d, err := time.ParseDuration(args[1])
	if err != nil || d < 0 {
		return nil, usagef("DURATION: a duration such as 30m or 8h (0 unmutes)")
	}
	until := int64(0)
	if d > 0 {
		until = time.Now().Add(d).UnixMilli()
	}
	r, err := s.c.Mute(ctx, args[0], until)
	if err != nil {
		return nil, err
	}
	return &muteResult{Conv: r.Conv, MutedUntil: r.Muted()}, nil
}

type editResult struct {
	Conv   string `json:"conv"`
	Seq    int64  `json:"seq"`
	Target int64  `json:"target"`
}

func (r *editResult) text(*session) string {
	return fmt.Sprintf("%s: edited #%d (edit event #%d)", r.Conv, r.Target, r.Seq)
}

func cmdEdit(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	conv, at, err := s.convFirst(args, 2)
	if err != nil {
		return nil, err
	}
	if len(args)-at < 2 {
		return nil, needUsage()
	}
	seq, err := parseSeq(args[at])
	if err != nil {
		return nil, err
	}
	r, err := s.c.Edit(ctx, conv, seq, []byte(strings.Join(args[at+1:], " ")))
	if err != nil {
		return nil, err
	}
	return &editResult{Conv: conv, Seq: r.Seq, Target: r.Target}, nil
}

type clearResult struct {
	Conv    string `json:"conv"`
	Cleared int64  `json:"cleared"`
	Read    int64  `json:"read"`
	Unread  int64  `json:"unread"`
}

func (r *clearResult) text(*session) string {
	return fmt.Sprintf("%s: cleared up to %d (read %d, unread %d)", r.Conv, r.Cleared, r.Read, r.Unread)
}

func cmdClear(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	conv, seq, err := s.convAndPosition(ctx, cl.args())
	if err != nil {
		return nil, err
	}
	r, err := s.c.Clear(ctx, conv, seq)
	if err != nil {
		return nil, err
	}
	return &clearResult{Conv: conv, Cleared: r.Cleared, Read: r.Read, Unread: r.Unread}, nil
}

type receiptsResult struct {
	Conv  string         `json:"conv"`
	Reads []userReadJSON `json:"reads"`
}

type userReadJSON struct {
	User string `json:"user"`
	Read int64  `json:"read"`
}

func (r *receiptsResult) text(*session) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: read positions", r.Conv)
	for _, u := range r.Reads {
		fmt.Fprintf(&b, "\n  %s %d", u.User, u.Read)
	}
	return b.String()
}

func cmdReceipts(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	conv, err := s.convOrCurrent(cl.args())
	if err != nil {
		return nil, err
	}
	r, err := s.c.Receipts(ctx, conv)
	if err != nil {
		return nil, err
	}
	out := &receiptsResult{Conv: conv, Reads: []userReadJSON{}}
	for _, u := range r.Reads {
		out.Reads = append(out.Reads, userReadJSON{User: u.User, Read: u.Read})
	}
	return out, nil
}

type privateResult struct {
	ReceiptsPrivate bool `json:"receipts_private"`
}

func (r *privateResult) text(*session) string {
	if r.ReceiptsPrivate {
		return "read receipts: private (other members do not see your read positions)"
	}
	return "read receipts: shown to other members"
}

func cmdPrivate(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	if len(args) != 1 || (args[0] != "on" && args[0] != "off") {
		return nil, needUsage()
	}
	r, err := s.c.SetReceiptsPrivate(ctx, args[0] == "on")
	if err != nil {
		return nil, err
	}
	return &privateResult{ReceiptsPrivate: r.ReceiptsPrivate}, nil
}

type typingResult struct {
	Conv string `json:"conv"`
}

func (r *typingResult) text(*session) string { return r.Conv + ": typing sent" }

func cmdTyping(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	conv, err := s.convOrCurrent(cl.args())
	if err != nil {
		return nil, err
	}
	if err := s.c.Typing(ctx, conv); err != nil {
		return nil, err
	}
	return &typingResult{Conv: conv}, nil
}
