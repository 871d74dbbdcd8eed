package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

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
