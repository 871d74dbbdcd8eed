package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

func oneShot(ctx context.Context, o options, args []string, stdout, stderr io.Writer) int {
	out := &printer{w: stdout}
	fail := func(err error) int {
		code, j, text := describe(err)
		if o.json {
			out.println(jsonLine(j))
		} else {
			fmt.Fprintln(stderr, "parley-cli: "+strings.TrimPrefix(text, "error: "))
		}
		return code
	}
	name := args[0]
	switch {
	case name == "quit" || name == "exit":
		return fail(usagef("%s is for the interactive session", name))
	case name != "watch" && o.wait != 0:
		return fail(usagef("-wait goes with watch"))
	case name == "help":
		r, _ := cmdHelp(ctx, nil, nil)
		if o.json {
			out.println(jsonLine(r))
		} else {
			out.println(r.text(nil))
		}
		return exitOK
	case findCommand(name) == nil:
		return fail(usagef("unknown command %q (try parley-cli help)", name))
	}
	live := liveOff
	if name == "watch" {
		live = liveText
		if o.json {
			live = liveJSON
		}
	}
	s, err := newSession(ctx, o, live, out, stderr)
	if err != nil {
		return fail(err)
	}
	defer s.close()
	if err := s.start(); err != nil {
		return fail(err)
	}
	if name == "watch" {
		return s.watch(ctx, args[1:], fail)
	}
	// Arguments were split by the shell: join them back (a message may
	// have been one quoted argument or several words).
	r, err := s.exec(ctx, parseLine(strings.Join(args, " ")))
	if err != nil {
		return fail(err)
	}
	if o.json {
		out.println(jsonLine(r))
	} else {
		out.println(r.text(s))
	}
	return exitOK
}

// watch prints new events until -wait passes, ctx ends, or the client
// stops for good (exit 1: another connection of this device took over).
func (s *session) watch(ctx context.Context, convs []string, fail func(error) int) int {
	if len(convs) > 0 {
		s.mu.Lock()
		s.only = map[string]bool{}
		for _, c := range convs {
			s.only[c] = true
		}
		s.mu.Unlock()
	}
	lctx, cancel := context.WithTimeout(ctx, s.o.timeout)
	err := s.followOnce(lctx)
	cancel()
	if err != nil {
		return fail(err)
	}
	for _, c := range convs {
		if !s.isKnown(c) {
			s.c.Watch(c, 0) // not listed (yet): from its start
		}
	}
	s.keepalive()
	var done <-chan time.Time
	if s.o.wait > 0 {
		t := time.NewTimer(s.o.wait)
		defer t.Stop()
		done = t.C
	}
	select {
	case <-done:
	case <-ctx.Done():
	case <-s.stopped: // replaced by another connection of this device
		code, _, _ := describe(s.c.Err())
		return code
	}
	return exitOK
}
