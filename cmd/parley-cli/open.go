package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/parley-im/parley/wire"
)

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
