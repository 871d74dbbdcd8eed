package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/wire"
)

// ---- command lines ----

// cmdLine is one command: its words, and where each starts in the line,
// so that a message keeps its spacing.
type cmdLine struct {
	line  string
	words []string
	offs  []int
}

func parseLine(line string) *cmdLine {
	cl := &cmdLine{line: line}
	for i := 0; i < len(line); {
		for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
			i++
		}
		if i == len(line) {
			break
		}
		j := i
		for j < len(line) && line[j] != ' ' && line[j] != '\t' {
			j++
		}
		cl.words = append(cl.words, line[i:j])
		cl.offs = append(cl.offs, i)
		i = j
	}
	return cl
}

// args are the words after the command name.
func (cl *cmdLine) args() []string { return cl.words[1:] }

// rest is the line from argument i on, as typed.
func (cl *cmdLine) rest(i int) string { return strings.TrimSpace(cl.line[cl.offs[i+1]:]) }

// usageError is a command used wrongly. An empty msg is filled in by exec
// with the command's usage (and note).
type usageError struct{ msg, note string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

type unreachableError struct{ err error }

func (e *unreachableError) Error() string { return e.err.Error() }
func (e *unreachableError) Unwrap() error { return e.err }

// ---- commands ----

// result is what a command returns: JSON-encodable, with a text form.
type result interface{ text(s *session) string }

type command struct {
	name, args, help string
	run              func(ctx context.Context, s *session, cl *cmdLine) (result, error)
}

var commands []command

func init() {
	commands = []command{
		{"convs", "", "list your conversations", cmdConvs},
		{"open", "CONV [all]", "sync CONV, print its events, make it the current conversation", cmdOpen},
		{"send", "[CONV] TEXT", "send a message (to the current conversation without CONV)", cmdSend},
		{"read", "[CONV] [SEQ]", "mark read up to SEQ (default: the head)", cmdRead},
		{"ack", "CONV SEQ", "set this device's delivery cursor (it only grows)", cmdAck},
		{"recall", "[CONV] SEQ", "recall your message at SEQ", cmdRecall},
		{"notify", "register PROVIDER TOKEN [sandbox] | unregister", "register this device's notification address (apns, fcm or webhook), or remove it", cmdNotify},
		{"mute", "CONV DURATION", "mute CONV for DURATION (e.g. 30m, 8h; 0 unmutes): only mentions notify", cmdMute},
		{"edit", "[CONV] SEQ TEXT", "replace the text of your message at SEQ", cmdEdit},
		{"clear", "[CONV] [SEQ]", "delete for me: hide CONV's history up to SEQ (default: the head) from all your devices", cmdClear},
		{"receipts", "[CONV]", "the members' read positions (conversations of the push tier)", cmdReceipts},
		{"private", "on|off", "hide (on) or show (off) your read positions from other members", cmdPrivate},
		{"typing", "[CONV]", "tell the other members you are typing", cmdTyping},
		{"create", "group ID|- MEMBER...", "create a group with you in it (ID -: the server picks one)", cmdCreate},
		{"create", "direct USER", "open (or find) your direct conversation with USER", cmdCreate},
		{"add", "CONV USER...", "add users to CONV", cmdAdd},
		{"leave", "CONV", "leave CONV", cmdLeave},
		{"role", "CONV USER owner|admin|member", "give USER a role in the group CONV (the owner only; owner transfers ownership)", cmdRole},
		{"remove", "CONV USER...", "remove users from the group CONV (the owner; admins: plain members only)", cmdRemove},
		{"mute-member", "CONV USER DURATION", "refuse USER's sends in CONV for DURATION (e.g. 10m; 0 unmutes)", cmdMuteMember},
		{"ban", "CONV USER", "ban USER from CONV (removed if a member; not addable until unbanned)", cmdBan},
		{"unban", "CONV USER", "lift USER's ban from CONV (does not add them back)", cmdUnban},
		{"conv-update", "CONV [-title TEXT] [-invite all|admins]", "set the group's title (the rest of the line up to -invite; empty clears it) or who may add members", cmdConvUpdate},
		{"snapshot", "CONV[:AFTER]...", "the batched login pull, as the server answers it (AFTER default 0)", cmdSnapshot},
		{"ping", "", "round-trip a ping", cmdPing},
		{"watch", "[CONV...]", "print new events (and hints, read changes, kicks) as they arrive; one-command mode", nil},
		{"help", "", "this list", cmdHelp},
		{"quit", "", "leave (also exit, Ctrl-D)", nil},
	}
}

func printHelp(w io.Writer) {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s %s\t%s\n", c.name, c.args, c.help)
	}
	tw.Flush()
}

func findCommand(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

// exec runs one command line.
func (s *session) exec(ctx context.Context, cl *cmdLine) (result, error) {
	cmd := findCommand(cl.words[0])
	if cmd == nil || cmd.run == nil {
		return nil, usagef("unknown command %q (try help)", cl.words[0])
	}
	ctx, cancel := context.WithTimeout(ctx, s.o.timeout)
	defer cancel()
	r, err := cmd.run(ctx, s, cl)
	var ue *usageError
	if errors.As(err, &ue) && ue.msg == "" {
		ue.msg = "usage: " + strings.TrimSpace(cmd.name+" "+cmd.args)
		if ue.note != "" {
			ue.msg += " (" + ue.note + ")"
		}
	}
	return r, err
}

// needUsage is a usage error that exec fills in with the command's usage.
func needUsage() error { return &usageError{} }

// convFirst splits "[CONV] REST..." when REST needs at least minRest
// words: the first word is CONV if there is no current conversation, or
// if it names one of the user's conversations and enough words follow.
func (s *session) convFirst(args []string, minRest int) (conv string, restAt int, err error) {
	cur := s.getCurrent()
	switch {
	case len(args) > minRest && (cur == "" || s.isKnown(args[0])):
		return args[0], 1, nil
	case cur != "" && len(args) >= minRest:
		return cur, 0, nil
	case cur == "" && len(args) == minRest:
		return "", 0, errNoCurrent()
	}
	return "", 0, needUsage()
}

// errNoCurrent: a command that defaults to the current conversation has
// none to default to.
func errNoCurrent() error {
	return &usageError{note: "no current conversation: give CONV, or open one"}
}

// convOrCurrent reads "[CONV]": the conversation named, or the current one.
func (s *session) convOrCurrent(args []string) (string, error) {
	conv := s.getCurrent()
	switch len(args) {
	case 0:
	case 1:
		conv = args[0]
	default:
		return "", needUsage()
	}
	if conv == "" {
		return "", errNoCurrent()
	}
	return conv, nil
}

// convAndPosition reads read's and clear's "[CONV] [SEQ]" (a lone number
// is SEQ when there is a current conversation it does not name); SEQ
// defaults to the conversation's head.
func (s *session) convAndPosition(ctx context.Context, args []string) (string, int64, error) {
	cur := s.getCurrent()
	var conv, seqArg string
	switch {
	case len(args) == 0:
		conv = cur
	case len(args) == 1 && cur != "" && !s.isKnown(args[0]) && isNumber(args[0]):
		conv, seqArg = cur, args[0]
	case len(args) == 1:
		conv = args[0]
	case len(args) == 2:
		conv, seqArg = args[0], args[1]
	default:
		return "", 0, needUsage()
	}
	if conv == "" {
		return "", 0, errNoCurrent()
	}
	if seqArg != "" {
		seq, err := parseSeq(seqArg)
		return conv, seq, err
	}
	conn, err := s.conn(ctx)
	if err != nil {
		return "", 0, err
	}
	p, err := conn.Sync(ctx, conv, 0, 1) // for its head
	if err != nil {
		return "", 0, err
	}
	return conv, p.Head, nil
}

func parseSeq(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, usagef("%q is not a seq", s)
	}
	return n, nil
}

// ---- convs ----

type convsResult struct {
	Items   []convJSON `json:"items"`
	current string
}

func (r *convsResult) text(s *session) string {
	if len(r.Items) == 0 {
		return "no conversations yet (create group ID MEMBER..., or create direct USER)"
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  CONV\tMODE\tHEAD\tDELIVERED\tREAD\tUNREAD\tLAST ACTIVITY")
	for _, it := range r.Items {
		mark := " "
		if it.Conv == r.current {
			mark = "*"
		}
		name := it.Conv
		if it.Title != "" {
			name += " (" + it.Title + ")"
		}
		fmt.Fprintf(tw, "%s %s\t%s\t%d\t%d\t%d\t%d\t%s\n", mark, name, it.Mode, it.Head, it.Delivered, it.Read, it.Unread, formatTs(it.LastTs, false))
	}
	tw.Flush()
	return strings.TrimRight(b.String(), "\n")
}

func cmdConvs(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	if len(cl.args()) != 0 {
		return nil, needUsage()
	}
	items, err := s.listConvs(ctx)
	if err != nil {
		return nil, err
	}
	r := &convsResult{Items: make([]convJSON, 0, len(items)), current: s.getCurrent()}
	followed := s.c.Watched()
	for _, it := range items {
		r.Items = append(r.Items, convJSON{Conv: it.Conv, Kind: it.Kind, Title: it.Title, Mode: it.Mode, Epoch: it.Epoch,
			Head: it.Head, MinSeq: it.MinSeq, Delivered: it.Delivered, Read: it.Read, Cleared: it.Cleared, Unread: it.Unread, LastTs: it.LastTs})
		if _, ok := followed[it.Conv]; !ok && s.live != liveOff {
			// New to this session (no push came for it): follow it like
			// the ones listed at the start.
			s.markShown(it.Conv, it.Head)
			s.c.Watch(it.Conv, min(it.Delivered, it.Head))
		}
	}
	return r, nil
}

// ---- open ----

// openShow is how many events open prints in text form without "all".
const openShow = 50

type openResult struct {
	Conv    string      `json:"conv"`
	Epoch   int64       `json:"epoch"`
	Head    int64       `json:"head"`
	MinSeq  int64       `json:"min_seq"`
	Upto    int64       `json:"upto"`
	Read    int64       `json:"read"`
	Unread  int64       `json:"unread"`
	Events  []jsonEvent `json:"events"`
	evs     []wire.Event
	showAll bool
}

func (r *openResult) text(s *session) string {
	var b strings.Builder
	evs := r.evs
	if !r.showAll && len(evs) > openShow {
		fmt.Fprintf(&b, "(%d earlier events not shown: open %s all)\n", len(evs)-openShow, r.Conv)
		evs = evs[len(evs)-openShow:]
	}
	for _, ev := range evs {
		b.WriteString(formatEvent(r.Conv, ev))
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "-- %s: %d visible events, head %d, read %d, unread %d", r.Conv, len(r.evs), r.Head, r.Read, r.Unread)
	if r.Upto < r.Head {
		fmt.Fprintf(&b, " (synced up to %d only: a send is still in flight on the server)", r.Upto)
	}
	return b.String()
}

func cmdOpen(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	if len(args) < 1 || len(args) > 2 || (len(args) == 2 && args[1] != "all") {
		return nil, needUsage()
	}
	conv := args[0]
	conn, err := s.conn(ctx)
	if err != nil {
		return nil, err
	}
	r := &openResult{Conv: conv, showAll: len(args) == 2}
	var after int64
	for stalls := 0; ; {
		p, err := conn.Sync(ctx, conv, after, 1000)
		if err != nil {
			return nil, err
		}
		r.evs = append(r.evs, p.Events...)
		r.Epoch, r.Head, r.MinSeq, r.Upto = p.Epoch, p.Head, p.MinSeq, p.Upto
		if !p.More || p.Upto >= p.Head {
			break
		}
		if p.Upto > after {
			after, stalls = p.Upto, 0
			continue
		}
		// upto did not move: the next seq is allocated but not committed
		// yet. Wait a little; give up after a second.
		if stalls++; stalls > 10 {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	// read and unread: a snapshot after what we hold sends no events back.
	snap, err := conn.Snapshot(ctx, []wire.ConvAfter{{Conv: conv, After: r.Upto}})
	if err != nil {
		return nil, err
	}
	if len(snap.Items) == 1 && snap.Items[0].Error == "" {
		r.Read, r.Unread = snap.Items[0].Read, snap.Items[0].Unread
	}
	r.Events = eventsJSON(r.evs)
	s.markShown(conv, r.Upto)
	if s.live != liveOff {
		s.c.Watch(conv, r.Upto) // follow it from here (a no-op if followed already)
	}
	s.setCurrent(conv)
	return r, nil
}

// ---- send ----

type sendResult struct {
	Conv string `json:"conv"`
	Cmid string `json:"cmid"`
	Seq  int64  `json:"seq"`
	Ts   int64  `json:"ts"`
	Dup  bool   `json:"dup,omitempty"`
}

func (r *sendResult) text(s *session) string {
	if r.Dup {
		return fmt.Sprintf("sent earlier: %s #%d (dup)", r.Conv, r.Seq)
	}
	return fmt.Sprintf("sent: %s #%d", r.Conv, r.Seq)
}

func newCmid() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "cli-" + hex.EncodeToString(b[:])
}

func cmdSend(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	conv, at, err := s.convFirst(cl.args(), 1)
	if err != nil {
		return nil, err
	}
	text := cl.rest(at)
	cmid := newCmid()
	r, err := s.c.Send(ctx, conv, cmid, []byte(text))
	if err != nil {
		return nil, err
	}
	return &sendResult{Conv: conv, Cmid: cmid, Seq: r.Seq, Ts: r.Ts, Dup: r.Dup}, nil
}

// ---- read, ack, recall ----

type readResult struct {
	Conv   string `json:"conv"`
	Read   int64  `json:"read"`
	Unread int64  `json:"unread"`
}

func (r *readResult) text(*session) string {
	return fmt.Sprintf("%s: read %d, unread %d", r.Conv, r.Read, r.Unread)
}

func cmdRead(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	conv, seq, err := s.convAndPosition(ctx, cl.args())
	if err != nil {
		return nil, err
	}
	r, err := s.c.Read(ctx, conv, seq)
	if err != nil {
		return nil, err
	}
	return &readResult{Conv: conv, Read: r.Read, Unread: r.Unread}, nil
}

func isNumber(s string) bool {
	_, err := strconv.ParseInt(s, 10, 64)
	return err == nil
}

type ackResult struct {
	Conv      string `json:"conv"`
	Delivered int64  `json:"delivered"`
}

func (r *ackResult) text(*session) string {
	return fmt.Sprintf("%s: delivered %d (this device's cursor)", r.Conv, r.Delivered)
}

func cmdAck(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	if len(args) != 2 {
		return nil, needUsage()
	}
	seq, err := parseSeq(args[1])
	if err != nil {
		return nil, err
	}
	r, err := s.c.Ack(ctx, args[0], seq)
	if err != nil {
		return nil, err
	}
	return &ackResult{Conv: args[0], Delivered: r.Delivered}, nil
}

type recallResult struct {
	Conv   string `json:"conv"`
	Seq    int64  `json:"seq"`
	Target int64  `json:"target"`
}

func (r *recallResult) text(*session) string {
	return fmt.Sprintf("%s: recalled #%d (recall event #%d)", r.Conv, r.Target, r.Seq)
}

func cmdRecall(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	conv, at, err := s.convFirst(args, 1)
	if err != nil {
		return nil, err
	}
	if len(args)-at != 1 {
		return nil, needUsage()
	}
	seq, err := parseSeq(args[at])
	if err != nil {
		return nil, err
	}
	r, err := s.c.Recall(ctx, conv, seq)
	if err != nil {
		return nil, err
	}
	return &recallResult{Conv: conv, Seq: r.Seq, Target: r.Target}, nil
}

// ---- notifications ----

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

// ---- membership ----

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

// ---- moderation ----

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

// ---- snapshot ----

type snapshotResult struct {
	Items []snapshotItemJSON `json:"items"`
	evs   [][]wire.Event
}

func (r *snapshotResult) text(*session) string {
	var b strings.Builder
	for i, it := range r.Items {
		if i > 0 {
			b.WriteByte('\n')
		}
		if it.Error != "" {
			fmt.Fprintf(&b, "-- %s: %s", it.Conv, it.Error)
			continue
		}
		for _, ev := range r.evs[i] {
			b.WriteString(formatEvent(it.Conv, ev))
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "-- %s: head %d, read %d, unread %d, %d events", it.Conv, it.Head, it.Read, it.Unread, len(it.Events))
		if it.Skipped > 0 {
			fmt.Fprintf(&b, " (the newest; %d older ones skipped)", it.Skipped)
		}
	}
	return b.String()
}

func cmdSnapshot(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	if len(args) == 0 {
		return nil, needUsage()
	}
	var convs []wire.ConvAfter
	for _, a := range args {
		ca := wire.ConvAfter{Conv: a}
		if i := strings.LastIndexByte(a, ':'); i > 0 {
			if n, err := strconv.ParseInt(a[i+1:], 10, 64); err == nil {
				ca = wire.ConvAfter{Conv: a[:i], After: n}
			}
		}
		convs = append(convs, ca)
	}
	r, err := s.c.Snapshot(ctx, convs)
	if err != nil {
		return nil, err
	}
	out := &snapshotResult{Items: make([]snapshotItemJSON, 0, len(r.Items))}
	for _, it := range r.Items {
		out.Items = append(out.Items, snapshotItemJSON{Conv: it.Conv, Head: it.Head, Read: it.Read, Unread: it.Unread,
			Events: eventsJSON(it.Events), Skipped: it.Skipped, Error: it.Error})
		out.evs = append(out.evs, it.Events)
	}
	return out, nil
}

// ---- ping, help ----

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

// ---- errors ----

// describe turns a command's error into (exit status, JSON, text).
func describe(err error) (int, errorJSON, string) {
	var ue *usageError
	var un *unreachableError
	switch we, isWire := wire.AsError(err); {
	case errors.As(err, &ue):
		return exitUsage, errorJSON{Error: "USAGE", Msg: ue.msg}, ue.msg
	case isWire:
		return exitRefused, errorJSON{Error: string(we.Code), Msg: we.Msg, RetryAfterMs: we.RetryAfterMs}, "error: " + we.Error()
	case errors.Is(err, client.ErrReplaced):
		return exitRefused, errorJSON{Error: "REPLACED", Msg: err.Error()}, "error: " + err.Error()
	case errors.As(err, &un):
		return exitUnreachable, errorJSON{Error: "UNREACHABLE", Msg: un.Error()}, "error: " + un.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return exitUnreachable, errorJSON{Error: "UNREACHABLE", Msg: "no answer in time"}, "error: no answer in time"
	default:
		return exitUnreachable, errorJSON{Error: "UNREACHABLE", Msg: err.Error()}, "error: " + err.Error()
	}
}

// ---- one command ----

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

// ---- interactive ----

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
