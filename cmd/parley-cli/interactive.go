package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
)

func interactive(ctx context.Context, o options, stdin io.Reader, stdout, stderr io.Writer) int {
	out := &printer{w: stdout, tty: isTerminal(stdin) && isTerminal(stdout)}
	s, err := newSession(ctx, o, liveText, out, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "parley-cli:", err)
		return exitUnreachable
	}
	defer s.close()
	if err := s.start(); err != nil {
		code, _, text := describe(err)
		if code != exitUnreachable {
			fmt.Fprintln(stderr, "parley-cli: "+strings.TrimPrefix(text, "error: "))
			return code
		}
		out.println(fmt.Sprintf("* not connected yet (%v); retrying in the background", err))
	} else {
		lctx, cancel := context.WithTimeout(ctx, o.timeout)
		if err := s.followOnce(lctx); err != nil {
			out.println(fmt.Sprintf("* could not list your conversations: %v", err))
		}
		cancel()
	}
	s.keepalive()
	s.mu.Lock()
	user, n, unread := s.user, len(s.known), s.unread
	s.mu.Unlock()
	if user != "" {
		out.println(fmt.Sprintf("connected to %s as %s (device %s): %d conversations, %d unread messages. Type help.",
			o.addr, user, o.device, n, unread))
	}

	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := newScanner(stdin)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-s.ctx.Done():
				return
			}
		}
	}()
	for {
		s.mu.Lock()
		prompt := s.user
		if prompt == "" {
			prompt = o.device
		}
		if s.current != "" {
			prompt += " " + s.current
		}
		s.mu.Unlock()
		out.showPrompt(prompt + "> ")
		var line string
		var ok bool
		select {
		case line, ok = <-lines:
		case <-ctx.Done():
			out.inputDone()
			out.println("")
			return exitOK
		}
		out.inputDone()
		if !ok {
			if out.tty {
				out.println("")
			}
			return exitOK
		}
		cl := parseLine(line)
		if len(cl.words) == 0 {
			continue
		}
		switch cl.words[0] {
		case "quit", "exit":
			return exitOK
		case "watch":
			out.println("(events print here as they arrive; watch is for one-command mode)")
			continue
		}
		r, err := s.exec(ctx, cl)
		if err != nil {
			_, _, text := describe(err)
			out.println(text)
			continue
		}
		out.println(r.text(s))
	}
}

func newScanner(r io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	return sc
}
