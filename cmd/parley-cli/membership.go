package main

import (
	"context"
	"fmt"

	"github.com/parley-im/parley/wire"
)

type headResult struct {
	Conv string `json:"conv"`
	Head int64  `json:"head"`
	what string
}

func (r *headResult) text(*session) string {
	return fmt.Sprintf("%s %s (head %d)", r.what, r.Conv, r.Head)
}

func cmdCreate(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	if len(args) < 2 {
		return nil, usagef("usage: create group ID|- MEMBER... | create direct USER")
	}
	var r wire.Message
	var err error
	switch args[0] {
	case wire.ConvGroup:
		id := args[1]
		if id == "-" {
			id = ""
		}
		r, err = s.c.CreateGroup(ctx, id, "", args[2:]...)
	case wire.ConvDirect:
		if len(args) != 2 {
			return nil, usagef("usage: create group ID|- MEMBER... | create direct USER")
		}
		r, err = s.c.CreateDirect(ctx, args[1])
	default:
		return nil, usagef("usage: create group ID|- MEMBER... | create direct USER")
	}
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.known[r.Conv] = args[0]
	s.mu.Unlock()
	s.setCurrent(r.Conv)
	return &headResult{Conv: r.Conv, Head: r.Head, what: "opened"}, nil
}

func cmdAdd(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	if len(args) < 2 {
		return nil, needUsage()
	}
	r, err := s.c.AddMembers(ctx, args[0], args[1:]...)
	if err != nil {
		return nil, err
	}
	return &headResult{Conv: args[0], Head: r.Head, what: "added to"}, nil
}

func cmdLeave(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	if len(args) != 1 {
		return nil, needUsage()
	}
	r, err := s.c.Leave(ctx, args[0])
	if err != nil {
		return nil, err
	}
	return &headResult{Conv: args[0], Head: r.Head, what: "left"}, nil
}
