package fanout

import (
	"cmp"
	"context"
	"slices"

	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/route"
	"github.com/parley-im/parley/store"
)

// deliverByOnlineIndex fans out events of conversations in the online and pull
// tiers (write_fanout_max members or more) from each conversation's
// online index (package route) instead of its member list: the cost of a
// message is the number of online devices, not of members.
//
//   - online tier: online members get the push and their conversation row
//     is written (write amplification ≈ online members);
//   - pull tier: online members get the push; no per-member writes at all
//     (offline members catch up from the group dimension: convs probes
//     the conversation's log, sync pages by seq).
//
// The index is kept current here for membership events: a join adds the
// new members' connected devices with from_seq = the join's seq (and
// builds the whole index when the join moved the group out of the push
// tier); a leave's entries were removed before the leave committed
// (BeforeLeave), so no later event reaches the leaver.
func (f *Fanout) deliverByOnlineIndex(ctx context.Context, evs []eventlog.Committed) error {
	byConv := map[string][]eventlog.Committed{}
	var order []string
	for _, e := range evs {
		if _, ok := byConv[e.Conv]; !ok {
			order = append(order, e.Conv)
		}
		byConv[e.Conv] = append(byConv[e.Conv], e)
	}
	out := deliveries{}
	var jobs []RowJob
	var firstErr error
	for _, conv := range order {
		ces := byConv[conv]
		slices.SortFunc(ces, func(a, b eventlog.Committed) int { return cmp.Compare(a.Seq, b.Seq) })
		if err := f.indexJoins(ctx, ces); err != nil && firstErr == nil {
			firstErr = err
		}
		entries, err := f.routes.Online(ctx, conv)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		for _, e := range ces {
			tier := TierOf(e.Members, f.writeMax, f.onlineMax)
			f.metrics.events.WithLabelValues(tier.String()).Inc()
			frame, err := PushFrame(e.Event)
			if err != nil {
				return err
			}
			users := map[string]bool{}
			for _, r := range entries {
				// Nothing below the start of the member's period.
				if r.FromSeq > e.Seq || r.Device == e.Device {
					continue
				}
				out.add(e.Event, frame, r.Entry, true)
				users[r.User] = true
			}
			if e.Kind == store.KindLeave || e.Leaving {
				// The leaver's entries are gone already; the leave event
				// itself (and a ban's update right before it) is still
				// theirs to see.
				leavers, err := f.routes.Lookup(ctx, e.Users)
				if err != nil && firstErr == nil {
					firstErr = err
				}
				for _, r := range leavers {
					if r.Device != e.Device {
						out.add(e.Event, frame, r, true)
					}
				}
			}
			if e.Sender != "" && e.Kind != store.KindLeave {
				users[e.Sender] = true // the sender is online (or the admin API acted: "")
			}
			if tier == TierOnline && len(users) > 0 {
				job := RowJob{Conv: e.Conv, Ts: e.Ts}
				for u := range users {
					job.Users = append(job.Users, u)
				}
				jobs = append(jobs, job)
				f.metrics.rowWrites.WithLabelValues(tier.String()).Add(float64(len(job.Users)))
			}
		}
	}
	f.dispatch(ctx, evs, out)
	if f.rows != nil {
		f.rows.Queue(ctx, jobs)
	}
	return firstErr
}

// indexJoins adds the connected devices of members who joined to the
// conversation's online index, before the join event is delivered (the
// joiners get it through the index).
func (f *Fanout) indexJoins(ctx context.Context, ces []eventlog.Committed) error {
	for _, e := range ces {
		if e.Kind != store.KindJoin {
			continue
		}
		var periods []store.CurrentPeriod
		if e.Members-int64(len(e.Users)) < int64(f.writeMax) {
			// The group just left the push tier (or was created big):
			// index every current member.
			ps, err := f.st.CurrentMembers(ctx, e.Conv)
			if err != nil {
				return err
			}
			periods = ps
		} else {
			for _, u := range e.Users {
				periods = append(periods, store.CurrentPeriod{Conv: e.Conv, User: u, FromSeq: e.Seq})
			}
		}
		if err := f.index(ctx, periods); err != nil {
			return err
		}
	}
	return nil
}

// index adds the connected devices of each period's user to the online
// index of its conversation.
func (f *Fanout) index(ctx context.Context, periods []store.CurrentPeriod) error {
	from := make(map[string]store.CurrentPeriod, len(periods))
	users := make([]string, 0, len(periods))
	for _, p := range periods {
		from[p.User] = p
		users = append(users, p.User)
	}
	var es []route.OnlineEntry
	for len(users) > 0 {
		n := min(len(users), 1000)
		rs, err := f.routes.Lookup(ctx, users[:n])
		if err != nil {
			return err
		}
		for _, r := range rs {
			p := from[r.User]
			es = append(es, route.OnlineEntry{Conv: p.Conv, FromSeq: p.FromSeq, Entry: r})
		}
		users = users[n:]
	}
	return f.routes.AddOnlineEntries(ctx, es)
}

// BeforeLeave removes user's devices from conv's online index before the
// leave commits, so that no event after the leave is pushed to them by
// the index. If the leave then fails, the user's devices miss pushes of
// that conversation until they reconnect (sync and hints repair them).
func (f *Fanout) BeforeLeave(ctx context.Context, conv, user string) error {
	rs, err := f.routes.Lookup(ctx, []string{user})
	if err != nil {
		return err
	}
	es := make([]route.OnlineEntry, len(rs))
	for i, r := range rs {
		es[i] = route.OnlineEntry{Conv: conv, Entry: r}
	}
	return f.routes.RemoveOnlineEntries(ctx, es)
}

// OnlineDevice is a device that authenticated, with its route's fencing
// token.
type OnlineDevice struct {
	User, Device string
	Token        int64
}

// Online adds devices to the online index of the conversations their
// users are current members of and that are in the big tiers: the
// gateway adds each device when it authenticates, many at once (one
// statement and one pipeline for a batch).
func (f *Fanout) Online(ctx context.Context, devs []OnlineDevice) error {
	users := make([]string, 0, len(devs))
	seen := make(map[string]bool, len(devs))
	for _, d := range devs {
		if !seen[d.User] {
			seen[d.User] = true
			users = append(users, d.User)
		}
	}
	big, err := f.st.BigMembershipsOf(ctx, users, f.writeMax)
	if err != nil || len(big) == 0 {
		return err
	}
	var es []route.OnlineEntry
	for _, d := range devs {
		for _, p := range big[d.User] {
			es = append(es, route.OnlineEntry{Conv: p.Conv, FromSeq: p.FromSeq,
				Entry: route.Entry{User: d.User, Device: d.Device, Token: d.Token, Gateway: f.routes.Gateway(), Boot: f.routes.Boot()}})
		}
	}
	return f.routes.AddOnlineEntries(ctx, es)
}
