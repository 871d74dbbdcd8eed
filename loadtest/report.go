package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/parley-im/parley/wire"
)

// Report is the result of one run; its JSON form is what -json writes.
type Report struct {
	Scenario    string     `json:"scenario"`
	RunPrefix   string     `json:"run_prefix"`
	Addr        string     `json:"addr"`
	Client      ClientMode `json:"client"`
	Transport   string     `json:"transport"`
	Pairs       int        `json:"pairs,omitempty"`
	Groups      int        `json:"groups,omitempty"`     // group: how many groups
	GroupSize   int        `json:"group_size,omitempty"` // group, storm: members per conversation
	Members     int        `json:"members,omitempty"`    // large: members of the group
	Online      int        `json:"online,omitempty"`     // large: members connected
	Senders     int        `json:"senders,omitempty"`    // large: members sending
	Connections int        `json:"connections"`
	BodySize    int        `json:"body_size"`
	Sources     int        `json:"sources"`
	FDLimit     int64      `json:"fd_limit"`

	DurationS      float64 `json:"duration_s"` // the send window
	DrainS         float64 `json:"drain_s"`    // how long the drain waited
	TargetRate     float64 `json:"target_rate"`
	SendsPerS      float64 `json:"sends_per_s"`      // sent / window
	ConfirmedPerS  float64 `json:"confirmed_per_s"`  // confirmed / (window or until the last send_ok, if later)
	DeliveriesPerS float64 `json:"deliveries_per_s"` // delivered / (window or until the last push, if later)

	Sent       int64 `json:"sent"`              // sends written
	Confirmed  int64 `json:"confirmed"`         // send_ok (dup:false)
	Delivered  int64 `json:"delivered"`         // unique msg events received by member devices (pushed, or synced after a hint)
	Synced     int64 `json:"delivered_by_sync"` // of those, read by the sync a hint asked for, never pushed
	Expected   int64 `json:"expected"`          // deliveries owed for the confirmed sends
	Lost       int64 `json:"lost"`              // confirmed, never received (pushed, or synced after a hint) by an online member device by the end of the drain
	Duplicated int64 `json:"duplicated"`        // pushes of a (conv, seq) the device already had
	// LostStored and LostNotStored split the lost ones the tool could check
	// with sync: in the log (a lost push, repairable by sync), or missing
	// from it although confirmed (a durability failure).
	LostChecked          int64            `json:"lost_checked,omitempty"`
	LostStored           int64            `json:"lost_stored,omitempty"`
	LostNotStored        int64            `json:"lost_not_stored,omitempty"`
	LostSample           []Lost           `json:"lost_sample,omitempty"`
	DeliveredUnconfirmed int64            `json:"delivered_unconfirmed"` // pushes of sends that got no send_ok
	UnexpectedPushes     int64            `json:"unexpected_pushes"`     // pushes to the sender itself or to an untracked conversation
	DupReplies           int64            `json:"dup_replies"`           // send_ok with dup:true
	BadReplies           int64            `json:"bad_replies"`           // replies the tool cannot match
	Acks                 int64            `json:"acks"`
	Hints                int64            `json:"hints"`
	Syncs                int64            `json:"syncs"` // sync pages read after hints
	Kicks                int64            `json:"kicks"`
	Disconnects          int64            `json:"disconnects"`
	Errors               map[string]int64 `json:"errors"` // code → count (docs/protocol.md §6 codes and the tool's own)

	SendOKMs      Summary `json:"send_ok_ms"`      // send → send_ok, from the intended start
	PushMs        Summary `json:"push_ms"`         // send → push at the receiver, from the intended start
	ScheduleLagMs Summary `json:"schedule_lag_ms"` // intended start → issued by the pacer
	ConnectMs     Summary `json:"connect_ms"`      // dial + auth
	// Mixed: read → read_ok, from the read's intended time, and read_ok
	// replies per second of the send window.
	ReadOKMs  *Summary `json:"read_ok_ms,omitempty"`
	ReadsPerS *float64 `json:"reads_per_s,omitempty"`

	// WAL is what PostgreSQL wrote during the window (with a commit probe).
	WAL *WALUse `json:"wal,omitempty"`

	ServerCPUUsPerSend     *float64 `json:"server_cpu_us_per_send"` // null without -server-pid
	ServerCPUUsPerDelivery *float64 `json:"server_cpu_us_per_delivery"`
	ClientCPUUsPerSend     *float64 `json:"client_cpu_us_per_send"`
	ClientCPUUsPerDelivery *float64 `json:"client_cpu_us_per_delivery"`
	CPU                    []CPUUse `json:"cpu,omitempty"`

	// ConnectRateLimited counts auths the server answered RATE_LIMITED
	// while the tool connected its devices (auth_rate); each was retried
	// after retry_after_ms and is not an error.
	ConnectRateLimited int64 `json:"connect_rate_limited"`

	// FanoutBacklogPeak is the highest parley_fanout_backlog sampled during
	// the run (with -metrics): how far the server's durable fan-out fell
	// behind.
	FanoutBacklogPeak *int64 `json:"fanout_backlog_peak,omitempty"`

	// Idle, Storm and Mixed are those scenarios' own results.
	Idle  *IdleReport  `json:"idle,omitempty"`
	Storm *StormReport `json:"storm,omitempty"`
	Mixed *MixedReport `json:"mixed,omitempty"`
	// Notify is the notify scenario's (notifications against the owed set).
	Notify *NotifyReport `json:"notify,omitempty"`
	// Typing is the typing scenario's (typing frames relayed).
	Typing *TypingReport `json:"typing,omitempty"`
	// Moderation is the large scenario's moderator's (-moderate).
	Moderation *ModerationReport `json:"moderation,omitempty"`

	// Latency is every latency metric of the run (send_ok and push again,
	// and the scenario's own: ping, reconnect, …); Timeline their
	// percentiles interval by interval; Curves their distributions.
	Latency     map[string]Summary      `json:"latency_ms,omitempty"`
	SeriesNames []string                `json:"series,omitempty"`
	Timeline    []TimelinePoint         `json:"timeline,omitempty"`
	Curves      map[string][]CurvePoint `json:"curves,omitempty"`

	Notes []string `json:"notes,omitempty"`
}

// CPUUse is one process tree's CPU over the measured window (send window
// plus drain).
type CPUUse struct {
	Name       string   `json:"name"`
	PID        int      `json:"pid,omitempty"`
	CPUSeconds float64  `json:"cpu_s"`
	Cores      float64  `json:"cores"`                 // CPU seconds per wall second
	UsPerSend  *float64 `json:"us_per_send,omitempty"` // per confirmed send
	UsPerDeliv *float64 `json:"us_per_delivery,omitempty"`
}

// Failed reports whether a confirmed message was lost or duplicated (the
// exit status of parley-load).
// For idle, a connection that failed or dropped fails the run; for
// storm, any error but RATE_LIMITED (which is retried) and any snapshot
// that did not carry what it should; for mixed, also a read_ok whose
// read position is below what the device reported.
func (rep *Report) Failed() bool {
	switch {
	case rep.Lost > 0 || rep.Duplicated > 0:
		return true
	case rep.Mixed != nil:
		return rep.Mixed.ReadShort > 0
	case rep.Notify != nil:
		return rep.Notify.Missing > 0 || rep.Notify.Unexpected > 0 || rep.Notify.BadSig > 0
	case rep.Idle != nil:
		return rep.Idle.Failed > 0 || rep.Idle.Dropped > 0
	case rep.Storm != nil:
		return rep.Storm.Failed > 0 || rep.Storm.SnapshotMismatch > 0
	}
	return false
}

// WriteJSON writes the report as indented JSON.
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteTable writes the human summary.
func (rep *Report) WriteTable(w io.Writer) {
	switch {
	case rep.Idle != nil:
		rep.writeIdleTable(w)
		return
	case rep.Storm != nil:
		rep.writeStormTable(w)
		return
	}
	fmt.Fprintf(w, "%s: %.1fs at %.0f/s target, %d connections over %s, body %d B, client %s, run %s\n",
		rep.Scenario, rep.DurationS, rep.TargetRate, rep.Connections, rep.Transport, rep.BodySize, rep.Client, rep.RunPrefix)
	switch rep.Scenario {
	case "group":
		fmt.Fprintf(w, "%d groups × %d members (one device each)\n", rep.Groups, rep.GroupSize)
	case "large":
		fmt.Fprintf(w, "one group of %d members, %d online, %d sending: each send is owed %d pushes\n",
			rep.Members, rep.Online, rep.Senders, rep.Online-1)
	case "notify":
		if n := rep.Notify; n != nil {
			fmt.Fprintf(w, "%d groups of 1 sender (%d sender devices) + %d receivers, of %d receivers (%d muted, %d connected and acking: owed nothing)\n",
				n.Groups, n.Senders, n.Size, n.Receivers, n.Muted, n.Acking)
			fmt.Fprintf(w, "notifications: %d owed, %d received, %d missing, %d duplicates, %d unexpected, %d bad signatures, %d collapsed; %.0f/s at the sink\n",
				n.Expected, n.Received, n.Missing, n.Duplicates, n.Unexpected, n.BadSig, n.Collapsed, n.PerS)
			fmt.Fprintf(w, "commit → sink ms: p50 %.1f  p90 %.1f  p99 %.1f  max %.1f\n", n.LatencyMs.P50, n.LatencyMs.P90, n.LatencyMs.P99, n.LatencyMs.Max)
		}
	case "direct":
		if n := rep.Notify; n != nil {
			fmt.Fprintf(w, "phones: %d notifications at the sink (%.0f/s), %d duplicates, %d to connected devices, %d bad signatures; commit → sink ms: p50 %.1f  p99 %.1f\n",
				n.Received, n.PerS, n.Duplicates, n.Unexpected, n.BadSig, n.LatencyMs.P50, n.LatencyMs.P99)
		}
	case "typing":
		if t := rep.Typing; t != nil {
			fmt.Fprintf(w, "%d devices in %d groups of %d (%d groups each): typing frames written %d (%.0f/s), received %d (%.0f/s)\n",
				t.Devices, t.Groups, t.GroupSize, t.GroupsPerDev, t.Written, t.WrittenPerS, t.Received, t.ReceivedPerS)
			if t.ServerUsPerIn != nil && t.ServerUsPerTo != nil {
				fmt.Fprintf(w, "server CPU: %.2f µs per frame written, %.2f µs per frame received\n", *t.ServerUsPerIn, *t.ServerUsPerTo)
			}
			fmt.Fprintf(w, "relay ms: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n", t.RelayMs.P50, t.RelayMs.P90, t.RelayMs.P99, t.RelayMs.Max)
		}
	case "mixed":
		if mr := rep.Mixed; mr != nil {
			fmt.Fprintf(w, "%d users, %d devices (%.2f per user, %d users with several), %d direct conversations (%d per user), %d groups of %d; %.2f conversations and %.3f msgs/s per user\n",
				mr.Users, mr.Devices, mr.DevicesPerUser, mr.MultiDeviceUsers, mr.Directs, mr.DirectsPerUser, mr.Groups, mr.GroupSize, mr.ConvsPerUser, mr.MsgsPerUserPerS)
		}
	}
	fmt.Fprintf(w, "sent %d (%.0f/s)  confirmed %d (%.0f/s)  delivered %d (%.0f/s)  lost %d  duplicated %d\n",
		rep.Sent, rep.SendsPerS, rep.Confirmed, rep.ConfirmedPerS, rep.Delivered, rep.DeliveriesPerS, rep.Lost, rep.Duplicated)
	if rep.Lost > 0 {
		fmt.Fprintf(w, "lost checked by sync: %d (in the log: %d, missing from the log: %d)\n", rep.LostChecked, rep.LostStored, rep.LostNotStored)
	}
	var errs []string
	for _, k := range slices.Sorted(maps.Keys(rep.Errors)) {
		errs = append(errs, fmt.Sprintf("%s=%d", k, rep.Errors[k]))
	}
	if len(errs) == 0 {
		errs = []string{"none"}
	}
	fmt.Fprintf(w, "errors: %s   acks %d  hints %d (synced %d pages, %d deliveries)  kicks %d  disconnects %d  unconfirmed deliveries %d\n",
		strings.Join(errs, " "), rep.Acks, rep.Hints, rep.Syncs, rep.Synced, rep.Kicks, rep.Disconnects, rep.DeliveredUnconfirmed)
	if mr := rep.Moderation; mr != nil {
		fmt.Fprintln(w, mr.text())
	}
	if mr := rep.Mixed; mr != nil {
		fmt.Fprintf(w, "sends: %d to direct conversations, %d to groups; pushes to the sender's other devices %d of %d owed\n",
			mr.DirectSends, mr.GroupSends, mr.SiblingPushed, mr.SiblingOwed)
		if mr.ReadProb > 0 {
			fmt.Fprintf(w, "reads (p %.2f, %.0f ms later): scheduled %d  sent %d  read_ok %d (%.0f/s)  unsent %d  short %d  read_changed %d\n",
				mr.ReadProb, mr.ReadDelayMs, mr.ReadsScheduled, mr.Reads, mr.ReadOK, mr.ReadsPerS, mr.ReadsUnsent, mr.ReadShort, mr.ReadChanged)
		} else {
			fmt.Fprintln(w, "reads: off (-read-prob 0)")
		}
		if f := mr.Features; f != nil {
			fmt.Fprintf(w, "features (whole run): typing %d (p %.2f) received %d; edits %d (p %.2f); clears %d (p %.2f); receipts queries %d (p %.2f), receipt frames received %d\n",
				f.Typing, f.TypingProb, f.TypingIn, f.Edits, f.EditProb, f.Clears, f.ClearProb, f.ReceiptQueries, f.ReceiptsProb, f.ReceiptsIn)
		} else {
			fmt.Fprintln(w, "features: off (-no-features)")
		}
	}
	if rep.FanoutBacklogPeak != nil {
		fmt.Fprintf(w, "fan-out stream backlog: peak %d jobs (parley_fanout_backlog, sampled each second)\n", *rep.FanoutBacklogPeak)
	}
	rep.writeCPU(w)
	if wal := rep.WAL; wal != nil {
		per := ""
		if wal.BytesPerSend != nil {
			per = fmt.Sprintf("  %.0f B and %.2f records per send", *wal.BytesPerSend, *wal.RecordsPerSend)
		}
		fmt.Fprintf(w, "wal %d B (the insert position's advance), %d records, %d full-page images (pg_stat_wal), the whole cluster, probe included%s; LSN %s to %s\n",
			wal.Bytes, wal.Records, wal.FPI, per, wal.StartLSN, wal.EndLSN)
	}
	rows := []latRow{{"send_ok_ms", rep.SendOKMs}, {"push_ms", rep.PushMs}}
	if rep.ReadOKMs != nil && rep.ReadOKMs.Count > 0 {
		rows = append(rows, latRow{"read_ok_ms", *rep.ReadOKMs})
	}
	if mr := rep.Moderation; mr != nil {
		rows = append(rows, latRow{"update_ok_ms", mr.UpdateOKMs}, latRow{"members_ok_ms", mr.MembersOKMs})
	}
	for _, probe := range []string{"pg_commit", "redis_ping"} {
		if sum, ok := rep.Latency[probe]; ok {
			rows = append(rows, latRow{probe + "_ms", sum})
		}
	}
	writeLatency(w, append(rows, latRow{"schedule_lag_ms", rep.ScheduleLagMs}, latRow{"connect_ms", rep.ConnectMs})...)
	rep.writeNotes(w)
}

func (rep *Report) writeNotes(w io.Writer) {
	for _, n := range rep.Notes {
		fmt.Fprintln(w, "note:", n)
	}
}

func (rep *Report) writeCPU(w io.Writer) {
	for _, c := range rep.CPU {
		per := ""
		if c.UsPerSend != nil {
			per = fmt.Sprintf("  %.1f µs/send", *c.UsPerSend)
		}
		if c.UsPerDeliv != nil {
			per += fmt.Sprintf("  %.2f µs/delivery", *c.UsPerDeliv)
		}
		pid := ""
		if c.PID > 0 {
			pid = fmt.Sprintf(" (pid %d)", c.PID)
		}
		fmt.Fprintf(w, "cpu %-10s %6.2f cores  %6.2f s%s%s\n", c.Name, c.Cores, c.CPUSeconds, per, pid)
	}
}

// latRow is one row of a percentile table.
type latRow struct {
	name string
	s    Summary
}

// writeLatency writes a percentile table of the named summaries.
func writeLatency(w io.Writer, rows ...latRow) {
	fmt.Fprintf(w, "%-16s %9s %9s %9s %9s %9s %10s\n", "ms", "p50", "p90", "p99", "p99.9", "max", "count")
	for _, row := range rows {
		fmt.Fprintf(w, "%-16s %9.2f %9.2f %9.2f %9.2f %9.2f %10d\n", row.name, row.s.P50, row.s.P90, row.s.P99, row.s.P999, row.s.Max, row.s.Count)
	}
}

// finish builds r.report from the counters of a finished load.
func (r *runner) finish(start, end, drainEnd int64, cpu map[string]time.Duration, self time.Duration) {
	rep := r.report
	rep.DurationS = round3(float64(end-start) / 1e9)
	rep.DrainS = round3(float64(drainEnd-end) / 1e9)
	rep.TargetRate = r.cfg.Rate
	rep.Client = r.cfg.Client
	rep.BodySize = r.cfg.BodySize
	rep.Sources = r.cfg.Sources
	rep.FDLimit = r.fdLimit
	rep.RunPrefix = r.cfg.Prefix
	rep.Addr, rep.Transport = r.cfg.Addr, r.cfg.Transport
	rep.ConnectRateLimited = r.connectLimited.Load()
	if r.backlogSeen.Load() {
		peak := r.backlogPeak.Load()
		rep.FanoutBacklogPeak = &peak
	}

	// Replies still owed.
	var unanswered, closed int64
	r.mu.Lock()
	conns := r.conns
	r.mu.Unlock()
	var readsUnanswered, readsClosed int64
	for _, c := range conns {
		if c.dead() {
			rep.Disconnects++
			closed += c.unanswered()
			readsClosed += c.unansweredReads()
		} else {
			unanswered += c.unanswered()
			readsUnanswered += c.unansweredReads()
		}
	}
	if r.cfg.Client == ClientDo {
		unanswered = r.inflight.Load()
		if r.mix != nil {
			readsUnanswered = r.mix.inflight.Load()
		}
	}
	r.errs.Add("NO_REPLY", unanswered)
	r.errs.Add("CONN_CLOSED", closed)
	r.errs.Add("READ_NO_REPLY", readsUnanswered)
	r.errs.Add("READ_CONN_CLOSED", readsClosed)

	t := r.tracker
	w := r.warm
	rep.Sent = r.sent.Load() - w.sent
	rep.Confirmed = t.confirmed.Load() - w.confirmed
	rep.Delivered = t.delivered.Load() - w.delivered
	rep.Synced = t.synced.Load() - w.synced
	rep.Syncs = r.syncs.Load() - w.syncs
	rep.Expected = t.expected.Load()
	rep.Duplicated = t.duplicated.Load()
	rep.UnexpectedPushes = t.unexpected.Load()
	rep.DupReplies = t.dupReplies.Load()
	rep.BadReplies = r.badReplies.Load()
	rep.Acks, rep.Hints, rep.Kicks = r.acks.Load()-w.acks, r.hints.Load()-w.hints, r.kicks.Load()
	rep.LostSample, rep.Lost, rep.DeliveredUnconfirmed = t.Check(20)
	rep.Errors = r.errs.Snapshot()
	// Rates: over the send window, or up to the last reply or push if
	// those kept coming during the drain (a server that fell behind).
	per := func(n, last int64) float64 {
		w := float64(max(end, last)-start) / 1e9
		if w <= 0 {
			return 0
		}
		return round3(float64(n) / w)
	}
	rep.SendsPerS = per(rep.Sent, end)
	rep.ConfirmedPerS = per(rep.Confirmed, r.lastOK.Load())
	rep.DeliveriesPerS = per(rep.Delivered, r.lastPush.Load())
	rep.SendOKMs = Summarize(r.sendOK.Total())
	rep.PushMs = Summarize(r.push.Total())
	rep.ScheduleLagMs = Summarize(r.lag.Total())
	rep.ConnectMs = Summarize(r.connect.Total())
	if r.mix != nil {
		r.finishMixed(float64(end-start) / 1e9)
	}
	if r.moderator != nil {
		rep.Moderation = r.moderator.report()
	}

	r.cpuReport(float64(drainEnd-start)/1e9, cpu, self, rep.Confirmed, rep.Delivered)
	if lag := rep.ScheduleLagMs; lag.P99 > 5 {
		r.note("the pacer fell behind its schedule (lag p99 %.1f ms, max %.1f ms): every latency includes that delay", lag.P99, lag.Max)
	}
	if rep.Hints > 0 {
		r.note("the server sent %d hints (it dropped pushes for a device that fell behind, or its redelivery scan saw pushes unacked for redelivery_delay); the tool synced as a client would: %d deliveries came by sync", rep.Hints, rep.Synced)
	}
	r.curves()
	rep.Notes = r.notes
}

// cpuReport fills the report's CPU figures: each watched process tree's
// and the tool's CPU over wall seconds, per send and per delivery (when
// those are not 0), and the machine's remainder.
func (r *runner) cpuReport(wall float64, cpu map[string]time.Duration, self time.Duration, sends, deliveries int64) {
	rep := r.report
	use := func(name string, pid int, d time.Duration) CPUUse {
		u := CPUUse{Name: name, PID: pid, CPUSeconds: round3(d.Seconds())}
		if wall > 0 {
			u.Cores = round3(d.Seconds() / wall)
		}
		if sends > 0 {
			v := round3(float64(d.Nanoseconds()) / 1e3 / float64(sends))
			u.UsPerSend = &v
		}
		if deliveries > 0 {
			v := round3(float64(d.Nanoseconds()) / 1e3 / float64(deliveries))
			u.UsPerDeliv = &v
		}
		return u
	}
	watched := r.watched()
	var known time.Duration // CPU of the watched processes and the tool
	for _, name := range slices.Sorted(maps.Keys(cpu)) {
		if name == "machine" {
			continue
		}
		u := use(name, watched[name], cpu[name])
		rep.CPU = append(rep.CPU, u)
		known += cpu[name]
		if name == "server" {
			rep.ServerCPUUsPerSend = u.UsPerSend
			rep.ServerCPUUsPerDelivery = u.UsPerDeliv
		}
	}
	for name, pid := range watched {
		if _, ok := cpu[name]; !ok {
			r.note("no CPU figures for %s (pid %d): cannot read /proc/%d/stat", name, pid, pid)
		}
	}
	if self > 0 {
		u := use("load-tool", 0, self)
		rep.CPU = append(rep.CPU, u)
		rep.ClientCPUUsPerSend = u.UsPerSend
		rep.ClientCPUUsPerDelivery = u.UsPerDeliv
		if u.Cores > 0.85 {
			r.note("the load tool used %.0f%% of a core: it may be the bottleneck", 100*u.Cores)
		}
		known += self
	}
	if m, ok := cpu["machine"]; ok {
		// Everything else that ran: the kernel's share of the network
		// stack, and other programs (a noisy neighbour skews the figures).
		rep.CPU = append(rep.CPU, use("machine", 0, m))
		if other := m - known; other > 0 {
			u := use("other", 0, other)
			rep.CPU = append(rep.CPU, u)
			if u.Cores > 0.25 {
				r.note("%.2f cores of CPU went to processes the report does not watch (other programs or the kernel): the figures may be skewed", u.Cores)
			}
		}
	}
}

// verifyLost syncs the conversations of (up to a few thousand) lost
// deliveries on the receiving device's connection, to tell a lost push
// (the event is in the log) from a lost message (confirmed, but not in
// the log).
func (r *runner) verifyLost(ctx context.Context) {
	lost, n, _ := r.tracker.Check(5000)
	if n == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	byDev := map[string]*Conn{}
	r.mu.Lock()
	for _, c := range r.conns {
		byDev[c.dev.ID] = c
	}
	r.mu.Unlock()
	type key struct{ conv, dev string }
	groups := map[key][]int64{}
	for _, l := range lost {
		k := key{l.Conv, l.Device}
		groups[k] = append(groups[k], l.Seq)
	}
	rep := r.report
	for k, seqs := range groups {
		c := byDev[k.dev]
		if c == nil || c.dead() {
			continue
		}
		lo, hi := slices.Min(seqs), slices.Max(seqs)
		found := map[int64]bool{}
		after, ok := lo-1, true
		for pages := 0; after < hi && pages < 1000; pages++ {
			m, err := c.c.Sync(ctx, k.conv, after, 1000)
			if err != nil {
				ok = false
				break
			}
			for _, ev := range m.Events {
				if ev.Kind == wire.KindMsg {
					found[ev.Seq] = true
				}
			}
			if !m.More || m.Upto <= after {
				break
			}
			after = m.Upto
		}
		if !ok {
			continue
		}
		for _, s := range seqs {
			rep.LostChecked++
			if found[s] {
				rep.LostStored++
			} else {
				rep.LostNotStored++
			}
		}
	}
}

func (rep *Report) writeErrors(w io.Writer) {
	var errs []string
	for _, k := range slices.Sorted(maps.Keys(rep.Errors)) {
		errs = append(errs, fmt.Sprintf("%s=%d", k, rep.Errors[k]))
	}
	if len(errs) == 0 {
		errs = []string{"none"}
	}
	fmt.Fprintf(w, "errors: %s\n", strings.Join(errs, " "))
}

func (rep *Report) writeIdleTable(w io.Writer) {
	ir := rep.Idle
	fmt.Fprintf(w, "idle: %d of %d connections over %s (connected in %.1fs), held %.1fs, ping every %gs, run %s\n",
		ir.Connected, ir.Conns, rep.Transport, ir.ConnectS, ir.HoldS, ir.PingIntervalS, rep.RunPrefix)
	fmt.Fprintf(w, "server RSS: %.1f MiB before, %.1f MiB connected, %.1f MiB after the hold (%s)\n",
		mib(ir.ServerRSSBefore), mib(ir.ServerRSSConnected), mib(ir.ServerRSSAfter), ir.RSSSource)
	fmt.Fprintf(w, "server RSS per connection: %.0f bytes (%.2f KiB)\n", ir.RSSPerConnBytes, ir.RSSPerConnBytes/1024)
	fmt.Fprintf(w, "tool RSS: %.1f MiB before, %.1f MiB after: %.0f bytes per connection\n",
		mib(ir.ToolRSSBefore), mib(ir.ToolRSSAfter), ir.ToolRSSPerConnBytes)
	gauge := "-"
	if ir.ServerConnectionGauge != nil {
		gauge = strconv.FormatInt(*ir.ServerConnectionGauge, 10)
	}
	fmt.Fprintf(w, "pings %d  dropped %d  failed %d  kicks %d  server gauge %s\n", ir.Pings, ir.Dropped, ir.Failed, ir.Kicks, gauge)
	rep.writeErrors(w)
	rep.writeCPU(w)
	writeLatency(w, latRow{"connect_ms", rep.Latency["connect"]}, latRow{"ping_ms", rep.Latency["ping"]})
	rep.writeNotes(w)
}

func (rep *Report) writeStormTable(w io.Writer) {
	sr := rep.Storm
	fmt.Fprintf(w, "storm: %d devices, %d conversations (%d per device, ~%d members, %d messages each), run %s\n",
		sr.Devices, sr.Conversations, sr.ConvsPerDevice, sr.GroupSize, sr.MsgsPerConv, rep.RunPrefix)
	if sr.Auth == "jwt" {
		fmt.Fprintf(w, "auth: JWT; every device (the first ones, then the storm's) created by its first login\n")
	}
	fmt.Fprintf(w, "setup: connected in %.1fs, sent %d messages in %.1fs (%d RATE_LIMITED answers retried)\n", sr.ConnectS, sr.Seeded, sr.SeedS, sr.SeedLimited)
	fmt.Fprintf(w, "reconnect + snapshot of all at once: %d finished, %d failed, wall %.0f ms\n", sr.Finished, sr.Failed, sr.WallMs)
	fmt.Fprintf(w, "rate-limited %d (retried %d)  snapshot items %d, events %d, item errors %d, mismatches %d\n",
		sr.RateLimited, sr.Retries, sr.SnapshotItems, sr.SnapshotEvents, sr.SnapshotItemErrors, sr.SnapshotMismatch)
	rep.writeErrors(w)
	rep.writeCPU(w)
	if sr.ServerCPUUsPerDevice != nil {
		fmt.Fprintf(w, "server CPU per reconnected device: %.0f µs\n", *sr.ServerCPUUsPerDevice)
	}
	writeLatency(w, latRow{"reconnect_ms", sr.ReconnectMs}, latRow{"auth_ms", sr.AuthMs}, latRow{"snapshot_ms", sr.SnapshotMs}, latRow{"connect_ms", rep.ConnectMs})
	rep.writeNotes(w)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
