package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/wire"
)

// What a session prints as things arrive.
type liveMode int

const (
	liveOff  liveMode = iota // one command: nothing
	liveText                 // interactive, watch: human lines
	liveJSON                 // watch -json: one JSON object per line
)

// session is one client.Client and what the CLI shows of it.
type session struct {
	o    options
	c    *client.Client
	tap  *tap // nil unless live or tracing
	out  *printer
	errw io.Writer
	live liveMode

	ctx    context.Context // cancelled by close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	user     string
	current  string            // interactive: the conversation of send/read/recall without CONV
	shown    map[string]int64  // conv → highest seq shown: live prints skip events up to it
	ready    bool              // the startup listing is done: live events may print
	early    []liveEvent       // events that arrived before
	only     map[string]bool   // watch CONV...: print only these
	lastErr  error             // why the last connection attempt failed
	connects int               // connections so far
	up       bool              // connected (for printing only the first failure of a reconnect)
	unread   int64             // unread messages at the start
	known    map[string]string // conv → kind, from the last convs listing

	followed  sync.Once
	followErr error
	stopOnce  sync.Once
	stopped   chan struct{} // closed when the client stops for good (replaced, AUTH_FAILED)
}

type liveEvent struct {
	conv string
	ev   wire.Event
}

// newSession creates (but does not start) the client.
func newSession(ctx context.Context, o options, live liveMode, out *printer, errw io.Writer) (*session, error) {
	s := &session{o: o, out: out, errw: errw, live: live, shown: map[string]int64{}, known: map[string]string{},
		stopped: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(ctx)
	addr := o.addr
	if live != liveOff || o.trace {
		var onRequest func([]byte)
		if o.trace {
			onRequest = s.traceRequest
		}
		t, err := newTap(o.addr, o.timeout, s.onFrame, onRequest)
		if err != nil {
			return nil, err
		}
		s.tap, addr = t, t.addr()
	}
	s.c = client.New(client.Options{
		Addr: addr, Device: o.device, Token: o.token,
		RequestTimeout: o.timeout,
		MinBackoff:     100 * time.Millisecond,
		MaxBackoff:     5 * time.Second,
		SyncLimit:      1000,
		OnEvent:        s.onEvent,
		OnReadChanged:  s.onReadChanged,
		OnState:        s.onState,
		AutoAck:        live != liveOff && o.autoAck,
	})
	return s, nil
}

// start connects, waiting at most -timeout. A refused token comes back
// as its *wire.Error; an unreachable server as an *unreachableError (the
// client keeps trying in the background until close).
func (s *session) start() error {
	ctx, cancel := context.WithTimeout(s.ctx, s.o.timeout)
	defer cancel()
	err := s.c.Start(ctx)
	if err == nil {
		if conn := s.c.Conn(); conn != nil {
			s.mu.Lock()
			s.user = conn.Auth.User
			s.mu.Unlock()
		}
		return nil
	}
	if _, ok := wire.AsError(err); ok {
		return err
	}
	s.mu.Lock()
	why := s.lastErr
	s.mu.Unlock()
	if why == nil {
		why = err
	}
	return &unreachableError{fmt.Errorf("cannot connect to %s: %w", s.o.addr, why)}
}

// close stops everything the session started.
func (s *session) close() {
	s.cancel()
	s.c.Close()
	if s.tap != nil {
		s.tap.close()
	}
	s.wg.Wait()
}

// followOnce lists the user's conversations and has the client track
// each one from this device's delivery cursor, so it fetches (and, with
// -autoack, acks) what this device has not received yet, as an app would.
// Only events above the head seen here print live: history and backlog
// are what `open` is for. Live sessions run it once, when first
// connected.
func (s *session) followOnce(ctx context.Context) error {
	s.followed.Do(func() { s.followErr = s.follow(ctx) })
	return s.followErr
}

func (s *session) follow(ctx context.Context) error {
	items, err := s.listConvs(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		for _, it := range items {
			s.shown[it.Conv] = max(s.shown[it.Conv], it.Head)
			s.c.Watch(it.Conv, min(it.Delivered, it.Head))
			s.unread += it.Unread
		}
	}
	// Events that arrived meanwhile print now, minus those the listing
	// covered (a conversation's history synced because a push came first).
	s.ready = true
	early := s.early
	s.early = nil
	for _, le := range early {
		if le.ev.Seq > s.shown[le.conv] {
			s.shown[le.conv] = le.ev.Seq
			s.emitEvent(le.conv, le.ev)
		}
	}
	return err
}

// listConvs reads every page of convs.
func (s *session) listConvs(ctx context.Context) ([]wire.Item, error) {
	var all []wire.Item
	cursor := ""
	for {
		r, err := s.c.Convs(ctx, 1000, cursor)
		if err != nil {
			return all, err
		}
		all = append(all, r.Items...)
		if !r.More || r.Cursor == "" {
			break
		}
		cursor = r.Cursor
	}
	s.mu.Lock()
	for _, it := range all {
		s.known[it.Conv] = it.Kind
	}
	s.mu.Unlock()
	return all, nil
}

// keepalive pings every 30 s: the server closes connections idle for
// idle_timeout (90 s by default), and a person at a prompt is often idle.
func (s *session) keepalive() {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-s.ctx.Done():
				return
			case <-t.C:
			}
			if conn := s.c.Conn(); conn != nil {
				ctx, cancel := context.WithTimeout(s.ctx, s.o.timeout)
				_ = conn.Ping(ctx)
				cancel()
			}
		}
	}()
}

// conn waits for the client's current connection (for the requests the
// client does not wrap: paged sync, ping).
func (s *session) conn(ctx context.Context) (*client.Conn, error) {
	for {
		if conn := s.c.Conn(); conn != nil {
			return conn, nil
		}
		if err := s.c.Err(); err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// isKnown says whether conv names a conversation of the user (listed, or
// tracked by the client).
func (s *session) isKnown(conv string) bool {
	s.mu.Lock()
	_, ok := s.known[conv]
	s.mu.Unlock()
	if ok {
		return true
	}
	_, ok = s.c.Watched()[conv]
	return ok
}

func (s *session) setCurrent(conv string) {
	s.mu.Lock()
	s.current = conv
	s.mu.Unlock()
}

func (s *session) getCurrent() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current
}

// markShown records that conv is shown up to seq (by open).
func (s *session) markShown(conv string, seq int64) {
	s.mu.Lock()
	s.shown[conv] = max(s.shown[conv], seq)
	s.mu.Unlock()
}

// ---- callbacks ----

// onEvent gets every event the client delivers, once, in order per
// conversation, whether a push, our own send or a sync brought it.
func (s *session) onEvent(conv string, ev wire.Event) {
	if s.live == liveOff {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ready {
		s.early = append(s.early, liveEvent{conv, ev})
		return
	}
	if ev.Seq <= s.shown[conv] {
		return
	}
	s.shown[conv] = ev.Seq
	s.emitEvent(conv, ev)
}

// emitEvent prints a live event (s.mu held).
func (s *session) emitEvent(conv string, ev wire.Event) {
	if s.only != nil && !s.only[conv] {
		return
	}
	switch s.live {
	case liveText:
		s.out.async(formatEvent(conv, ev))
	case liveJSON:
		s.out.async(jsonLine(pushJSON{T: wire.TPush, Conv: conv, jsonEvent: eventJSON(ev)}))
	}
}

func (s *session) onReadChanged(conv string, read, unread int64) {
	if !s.wants(conv) {
		return
	}
	switch s.live {
	case liveText:
		s.out.async(fmt.Sprintf("* %s: read %d, unread %d (on another device)", conv, read, unread))
	case liveJSON:
		s.out.async(jsonLine(readChangedJSON{T: wire.TReadChanged, Conv: conv, Read: read, Unread: unread}))
	}
}

// onFrame sees every frame the server sends (through the tap): hints and
// kicks print from here; events print from onEvent, after the client's
// dedupe and gap repair.
func (s *session) onFrame(m wire.Message) {
	if s.o.trace {
		s.trace("<< " + traceFrame(m))
	}
	switch m.T {
	case wire.THint:
		if !s.wants(m.Conv) {
			return
		}
		switch s.live {
		case liveText:
			s.out.async(fmt.Sprintf("* hint %s: head %d (we hold up to %d; syncing if behind)", m.Conv, m.Head, s.c.Cursor(m.Conv)))
		case liveJSON:
			s.out.async(jsonLine(hintJSON{T: wire.THint, Conv: m.Conv, Head: m.Head}))
		}
	case wire.TTyping, wire.TReceipt:
		if !s.wants(m.Conv) {
			return
		}
		switch {
		case s.live == liveText && m.T == wire.TTyping:
			s.out.async(fmt.Sprintf("* %s: %s is typing…", m.Conv, m.User))
		case s.live == liveText:
			s.out.async(fmt.Sprintf("* %s: %s read up to %d", m.Conv, m.User, m.Read))
		case s.live == liveJSON:
			s.out.async(jsonLine(memberJSON{T: m.T, Conv: m.Conv, User: m.User, Read: m.Read}))
		}
	case wire.TKick:
		switch s.live {
		case liveText:
			s.out.async("* kick: " + m.Reason)
		case liveJSON:
			s.out.async(jsonLine(kickJSON{T: wire.TKick, Reason: m.Reason}))
		}
	}
}

// traceRequest shows a frame the client sends (-trace).
func (s *session) traceRequest(body []byte) {
	q, err := wire.DecodeRequest(body)
	if err != nil {
		s.trace(fmt.Sprintf(">> (%d bytes: %v)", len(body), err))
		return
	}
	s.trace(">> " + traceRequest(q))
}

// trace prints a -trace line: inline in the interactive session, on
// stderr otherwise.
func (s *session) trace(line string) {
	if s.live == liveText && s.out.tty {
		s.out.async(line)
		return
	}
	fmt.Fprintln(s.errw, line)
}

func (s *session) wants(conv string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.only == nil || s.only[conv]
}

func (s *session) onState(st client.State, err error) {
	if err != nil && st != client.Closed {
		if s.tap != nil {
			if derr := s.tap.takeDialErr(); derr != nil {
				err = derr // "connection refused", not the EOF the tap caused
			}
		}
		s.mu.Lock()
		s.lastErr = err
		s.mu.Unlock()
	}
	if st == client.Closed && err != nil {
		s.stopOnce.Do(func() { close(s.stopped) })
	}
	if s.live == liveOff {
		return
	}
	var msg string
	switch st {
	case client.Connected:
		s.mu.Lock()
		s.connects++
		s.up = true
		first := s.connects == 1
		if conn := s.c.Conn(); conn != nil && s.user == "" {
			s.user = conn.Auth.User // for the prompt, if start gave up waiting
		}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			ctx, cancel := context.WithTimeout(s.ctx, s.o.timeout)
			defer cancel()
			if first {
				// Usually done already (start, then followOnce); not if
				// the server was down when we started.
				_ = s.followOnce(ctx)
				return
			}
			// Conversations the user was added to while we were away:
			// follow them too; what this device has not received prints.
			items, err := s.listConvs(ctx)
			if err != nil {
				return
			}
			for _, it := range items {
				s.c.Watch(it.Conv, min(it.Delivered, it.Head)) // a no-op for those followed already
			}
		}()
		if first {
			return
		}
		msg = "* reconnected"
	case client.Disconnected:
		s.mu.Lock()
		wasUp, ready := s.up, s.ready
		s.up = false
		s.mu.Unlock()
		if !wasUp || !ready {
			return // a retry failed again (or still starting: start reports it)
		}
		msg = fmt.Sprintf("* disconnected (%v); reconnecting", err)
	case client.Closed:
		s.mu.Lock()
		ready := s.ready
		s.mu.Unlock()
		switch {
		case err == nil:
			return // we closed it
		case !ready:
			return // still starting: start reports it
		case errors.Is(err, client.ErrReplaced):
			msg = "* closed: another connection of this device took over; not reconnecting"
		default:
			msg = fmt.Sprintf("* closed: %v", err)
		}
	default:
		return
	}
	if s.live == liveJSON {
		fmt.Fprintln(s.errw, strings.TrimPrefix(msg, "* "))
		return
	}
	s.out.async(msg)
}

// ---- output ----

// printer serializes output and keeps the prompt readable: a line that
// arrives while the prompt waits for input is printed above it, and the
// prompt is drawn again. (Without a line editor, what the user had typed
// stays in the terminal's line buffer but is no longer shown; Ctrl-R
// redraws it on most terminals.)
type printer struct {
	mu     sync.Mutex
	w      io.Writer
	tty    bool
	prompt string
	shown  bool // the prompt is on screen, waiting for input
}

// println prints command output (the prompt is not shown meanwhile).
func (p *printer) println(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintln(p.w, s)
}

// async prints a line that arrived on its own.
func (p *printer) async(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.shown {
		fmt.Fprintf(p.w, "\r\033[K%s\n%s", s, p.prompt)
		return
	}
	fmt.Fprintln(p.w, s)
}

// showPrompt draws the prompt (only on a terminal).
func (p *printer) showPrompt(prompt string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prompt = prompt
	if p.tty {
		p.shown = true
		fmt.Fprint(p.w, prompt)
	}
}

// inputDone: a line was read; the prompt is gone.
func (p *printer) inputDone() {
	p.mu.Lock()
	p.shown = false
	p.mu.Unlock()
}

func isTerminal(v any) bool {
	f, ok := v.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func jsonLine(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf(`{"error":"INTERNAL","msg":%q}`, err.Error())
	}
	return string(b)
}
