package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/parley-im/parley/wire"
)

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
