package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

type pingResult struct {
	RttMs float64 `json:"rtt_ms"`
}

func (r *pingResult) text(*session) string { return fmt.Sprintf("pong in %.2f ms", r.RttMs) }

func cmdPing(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	if len(cl.args()) != 0 {
		return nil, needUsage()
	}
	conn, err := s.conn(ctx)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := conn.Ping(ctx); err != nil {
		return nil, err
	}
	return &pingResult{RttMs: float64(time.Since(t0).Microseconds()) / 1000}, nil
}

type helpResult struct {
	Commands []string `json:"commands"`
}

func (r *helpResult) text(*session) string {
	var b strings.Builder
	printHelp(&b)
	return strings.TrimRight(b.String(), "\n")
}

func cmdHelp(context.Context, *session, *cmdLine) (result, error) {
	r := &helpResult{}
	for _, c := range commands {
		r.Commands = append(r.Commands, strings.TrimSpace(c.name+" "+c.args))
	}
	return r, nil
}
