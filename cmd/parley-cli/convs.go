package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
)

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
