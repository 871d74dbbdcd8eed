package loadtest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The large scenario's moderator (Config.Moderate, docs/loadtest.md,
// "large"): one online member that does not send, made the group's owner
// through the admin API before the run, which during the send window
// alternately mutes (member_mute, muted_until a few seconds ahead) and
// removes (members_remove) offline members at Moderate requests a
// second, on its own clock like the sends. Its targets have no device, so
// the owed deliveries of the senders' messages are the same with or
// without it; what it adds is the server's moderation work and an update
// or leave event pushed to every online member per request.

// Moderation bounds.
const (
	// MaxModerate bounds Config.Moderate (requests per second).
	MaxModerate = 1000
	// moderateMuteFor is how far ahead a moderator's mute ends.
	moderateMuteFor = 5 * time.Second
	// moderateTimeout bounds each moderation request.
	moderateTimeout = 10 * time.Second
)

// moderator drives the moderation requests of one run.
type moderator struct {
	// Static after setup.
	r         *runner
	conn      *Conn // the owner's connection
	conv      string
	rate      float64
	removable []string // offline members it removes, in order, while any is left
	mutable   []string // offline members it mutes, in turn (never removed)

	nextRemove atomic.Int64 // index of the next user of removable
	mutes      atomic.Int64 // member_mute requests made
	removes    atomic.Int64 // members_remove requests made
	removed    atomic.Int64 // of those, answered members_ok
	syncs      atomic.Int64 // sync pages read to fetch its own leave events
	errs       Errors
	updateOK   *Hist // member_mute → update_ok, from the intended start
	membersOK  *Hist // members_remove → members_ok, from the intended start
	wg         sync.WaitGroup
}

// ModerationReport is the moderator's part of the large report.
type ModerationReport struct {
	Rate      float64          `json:"rate"`      // requests per second asked (-moderate)
	Moderator string           `json:"moderator"` // the owner's device
	Requests  int64            `json:"requests"`  // member_mute and members_remove requests made
	Mutes     int64            `json:"mutes"`     // member_mute requests
	Removes   int64            `json:"removes"`   // members_remove requests (one user each)
	Removed   int64            `json:"removed"`   // users removed (members_ok)
	Syncs     int64            `json:"syncs"`     // sync pages the moderator read for its own leave events (not pushed to it)
	Errors    map[string]int64 `json:"errors"`    // code → count, of the moderation requests and those syncs (SYNC_ + code)
	// UpdateOKMs is member_mute → update_ok and MembersOKMs
	// members_remove → members_ok, each from the request's intended start.
	UpdateOKMs  Summary `json:"update_ok_ms"`
	MembersOKMs Summary `json:"members_ok_ms"`
}

// newModerator sets up the moderator of the large group conv on conn (the
// group's owner); offline are the members without a device, its targets.
func (r *runner) newModerator(conn *Conn, conv string, offline []string) *moderator {
	m := &moderator{r: r, conn: conn, conv: conv, rate: r.cfg.Moderate, updateOK: NewHist(), membersOK: NewHist()}
	for i, u := range offline {
		if i%2 == 0 {
			m.removable = append(m.removable, u)
		} else {
			m.mutable = append(m.mutable, u)
		}
	}
	return m
}

// run makes request i at start + i/rate until stop is closed, each on a
// goroutine of its own (open loop: a slow reply delays no later request),
// then waits for the replies.
func (m *moderator) run(stop <-chan struct{}) {
	defer m.wg.Wait()
	clk := m.r.clk
	start := clk.now()
	for i := int64(0); ; i++ {
		intended := start + int64(float64(i)*1e9/m.rate)
		if d := intended - clk.now(); d > 0 {
			t := time.NewTimer(time.Duration(d))
			select {
			case <-stop:
				t.Stop()
				return
			case <-t.C:
			}
		} else {
			select {
			case <-stop:
				return
			default:
			}
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.act(i, intended)
		}()
	}
}

// act makes request i: a removal for odd i while removable users are
// left, otherwise a mute.
func (m *moderator) act(i, intended int64) {
	ctx, cancel := context.WithTimeout(m.r.ctx, moderateTimeout)
	defer cancel()
	c := m.conn
	if i%2 == 1 {
		if j := m.nextRemove.Add(1) - 1; j < int64(len(m.removable)) {
			m.removes.Add(1)
			rep, err := c.c.RemoveMembers(ctx, m.conv, m.removable[j])
			if err != nil {
				m.errs.Add(errCode(err), 1)
				return
			}
			m.membersOK.Record(c.idx, m.r.clk.now()-intended)
			m.removed.Add(1)
			m.fetch(ctx, rep.Head)
			return
		}
	}
	user := m.mutable[(i/2)%int64(len(m.mutable))]
	m.mutes.Add(1)
	rep, err := c.c.MuteMember(ctx, m.conv, user, time.Now().Add(moderateMuteFor).UnixMilli())
	if err != nil {
		m.errs.Add(errCode(err), 1)
		return
	}
	m.updateOK.Record(c.idx, m.r.clk.now()-intended)
	if ref, ok := c.routes[m.conv]; ok && ref.i >= 0 {
		m.r.tracker.Held(ref.track, ref.i, rep.Seq)
		c.armAck()
	}
}

// fetch syncs the group on the moderator's connection from its cursor up
// to head, as a client does after members_ok: the server does not push
// the leave event to the device that made it, and members_ok tells only
// the head, not the leave's seq. It runs within the request, so it is
// over when the moderator stops (a sync left to the hint syncers could be
// cut off by the end of the run).
func (m *moderator) fetch(ctx context.Context, head int64) {
	c := m.conn
	ref, ok := c.routes[m.conv]
	if !ok || ref.i < 0 {
		return
	}
	after := ref.track.cursorOf(ref.i)
	for tries := 0; after < head && tries < 100; tries++ {
		p, err := c.c.Sync(ctx, m.conv, after, 1000)
		if err != nil {
			m.errs.Add("SYNC_"+errCode(err), 1)
			return
		}
		m.syncs.Add(1)
		c.recordSynced(ref, p.Events)
		if p.Upto > after {
			after = p.Upto
			continue
		}
		// The page stopped at a seq still being committed: again shortly.
		select {
		case <-ctx.Done():
			m.errs.Add("SYNC_NO_REPLY", 1)
			return
		case <-time.After(hintRetry):
		}
	}
}

// report returns the moderator's figures.
func (m *moderator) report() *ModerationReport {
	return &ModerationReport{Rate: m.rate, Moderator: m.conn.dev.ID,
		Requests: m.mutes.Load() + m.removes.Load(), Mutes: m.mutes.Load(), Removes: m.removes.Load(), Removed: m.removed.Load(), Syncs: m.syncs.Load(),
		Errors: m.errs.Snapshot(), UpdateOKMs: Summarize(m.updateOK.Total()), MembersOKMs: Summarize(m.membersOK.Total())}
}

// text is the moderation line of the text report.
func (mr *ModerationReport) text() string {
	var errs []string
	for _, k := range slices.Sorted(maps.Keys(mr.Errors)) {
		errs = append(errs, fmt.Sprintf("%s=%d", k, mr.Errors[k]))
	}
	if len(errs) == 0 {
		errs = []string{"none"}
	}
	return fmt.Sprintf("moderation (%g/s by %s, the owner): %d requests, %d member_mute and %d members_remove (%d users removed, %d sync pages for its own leaves); errors: %s",
		mr.Rate, mr.Moderator, mr.Requests, mr.Mutes, mr.Removes, mr.Removed, mr.Syncs, strings.Join(errs, " "))
}
