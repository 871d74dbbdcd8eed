package loadtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/wire"
)

// maxSnapshotConvs is the most conversations one snapshot may name (the
// server's limit).
const maxSnapshotConvs = 500

// StormReport is the result of scenario storm.
type StormReport struct {
	Auth           string  `json:"auth"` // "token" or "jwt" (-jwt-secret, -jwt-key: every login a first one, provisioned by the server)
	Devices        int     `json:"devices"`
	Conversations  int     `json:"conversations"`
	ConvsPerDevice int     `json:"convs_per_device"`
	GroupSize      int     `json:"group_size"`
	MsgsPerConv    int     `json:"msgs_per_conv"`
	ConnectS       float64 `json:"connect_s"`            // the first connect of every device, before the storm
	ConnectLimited int64   `json:"connect_rate_limited"` // RATE_LIMITED answers to those auths, retried
	SeedS          float64 `json:"seed_s"`               // sending the messages
	Seeded         int64   `json:"seeded"`               // messages confirmed
	SeedLimited    int64   `json:"seed_rate_limited"`    // RATE_LIMITED answers while seeding, retried

	// The storm: every device reconnects at the same instant (t0), then
	// authenticates and sends one snapshot of all its conversations.
	WallMs      float64 `json:"wall_ms"`              // t0 → the last snapshot_ok: every device finished (if none failed)
	Finished    int64   `json:"finished"`             // devices that got their snapshot
	Failed      int64   `json:"failed"`               // devices that did not (by code in errors)
	RateLimited int64   `json:"rate_limited"`         // RATE_LIMITED answers (auth or snapshot); not errors
	Retries     int64   `json:"rate_limited_retries"` // requests sent again after retry_after_ms because of them
	ReconnectMs Summary `json:"reconnect_ms"`         // per device: t0 → snapshot_ok
	AuthMs      Summary `json:"auth_ms"`              // per device: t0 → auth_ok
	SnapshotMs  Summary `json:"snapshot_ms"`          // per device: snapshot sent → snapshot_ok

	SnapshotItems      int64 `json:"snapshot_items"`
	SnapshotEvents     int64 `json:"snapshot_events"`
	SnapshotItemErrors int64 `json:"snapshot_item_errors"` // items with error (by code in errors, "ITEM_<code>")
	SnapshotMismatch   int64 `json:"snapshot_mismatch"`    // items whose head or events differ from what was committed

	ServerCPUUsPerDevice *float64 `json:"server_cpu_us_per_device"` // server CPU during the storm per reconnected device
}

// stormConvs makes the storm's conversations: in each of rounds rounds,
// the devices are shuffled and cut into groups of size (a last group of
// one joins the one before), so every device is in exactly rounds
// conversations. It returns each conversation's member device indices.
func stormConvs(devices, size, rounds int) [][]int {
	var out [][]int
	for round := range rounds {
		perm := rand.New(rand.NewPCG(uint64(round), 0x5eed)).Perm(devices)
		first := len(out)
		for i := 0; i < devices; i += size {
			out = append(out, perm[i:min(i+size, devices)])
		}
		if last := len(out) - 1; last > first && len(out[last]) < 2 {
			out[last-1] = append(out[last-1], out[last]...)
			out = out[:last]
		}
	}
	return out
}

// retryAfter reports whether err is RATE_LIMITED and how long to wait.
func retryAfter(err error) (time.Duration, bool) {
	e, ok := wire.AsError(err)
	if !ok || e.Code != wire.RateLimited {
		return 0, false
	}
	return time.Duration(max(e.RetryAfterMs, 1)) * time.Millisecond, true
}

// sleepCtx waits d; false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// dialCode names a failed client.Dial.
func dialCode(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return "DIAL"
	}
	return errCode(err)
}

// runStorm is scenario storm: Devices devices, each in ConvsPer
// conversations of Size members holding Msgs messages each, connect; then
// all drop at once and reconnect at once, each doing auth and then ONE
// snapshot of all its conversations from the cursor it held before the
// messages were sent (so each item carries Msgs events). RATE_LIMITED is
// answered by waiting retry_after_ms and asking again, and counted apart
// from the errors.
func runStorm(ctx context.Context, r *runner) error {
	if err := r.checkFDs(); err != nil {
		return err
	}
	n := r.cfg.Devices
	// Every device dials twice; the first connections' ports may sit in
	// TIME_WAIT.
	if err := r.checkConns(n, 2*n); err != nil {
		return err
	}
	rep := r.report
	sr := &StormReport{Auth: "token", Devices: n, ConvsPerDevice: r.cfg.ConvsPer, GroupSize: r.cfg.Size, MsgsPerConv: r.cfg.Msgs}
	rep.Storm = sr
	rep.RunPrefix, rep.Addr, rep.Sources, rep.FDLimit, rep.BodySize = r.cfg.Prefix, r.cfg.Addr, r.cfg.Sources, r.fdLimit, r.cfg.BodySize

	// With a JWT signer, nothing is made through the admin API but the
	// conversations: each user's first device ("…a") is created by its
	// first login, before the messages, and the storm is every user's
	// first login from a second device ("…b"), also created by it.
	sign, err := newSigner(r.cfg.JWTSecret, r.cfg.JWTKeyFile)
	if err != nil {
		return err
	}
	var users []string
	var devs []Device
	t0 := time.Now()
	if sign != nil {
		sr.Auth = "jwt"
		users, devs = jwtDevices(r.cfg.Prefix, n, "a")
	} else if users, devs, err = r.provisionUsers(ctx, n, n); err != nil {
		return err
	}
	groups := stormConvs(n, r.cfg.Size, r.cfg.ConvsPer)
	convsOf := make([][]int, n) // device → its conversations
	var created []ConvCreated
	var before []int64 // each conversation's head before the messages
	makeConvs := func() error {
		t0 := time.Now()
		specs := make([]ConvSpec, len(groups))
		for j, g := range groups {
			members := make([]string, len(g))
			for k, d := range g {
				members[k] = users[d]
				convsOf[d] = append(convsOf[d], j)
			}
			specs[j] = ConvSpec{ID: r.cfg.Prefix + "s" + strconv.Itoa(j), Kind: "group", Members: members}
		}
		var err error
		if created, err = r.admin.Conversations(ctx, specs); err != nil {
			return fmt.Errorf("provisioning conversations: %w", err)
		}
		sr.Conversations = len(created)
		before = make([]int64, len(created))
		for j, c := range created {
			before[j] = c.Head
		}
		what := "users and devices, "
		if sign != nil {
			what = "" // the users and devices were made by their first logins
		}
		fmt.Fprintf(r.cfg.Out, "provisioned %d %s%d conversations of about %d in %s (prefix %s)\n",
			n, what, len(created), r.cfg.Size, time.Since(t0).Round(time.Millisecond), r.cfg.Prefix)
		return nil
	}
	if sign == nil {
		if err := makeConvs(); err != nil {
			return err
		}
	}

	dialers := r.dialers()
	var kicks, pushes atomic.Int64
	opts := func(i int) client.DialOptions {
		return client.DialOptions{Dialer: dialers[i%len(dialers)], OnServerFrame: func(m wire.Message) {
			switch m.T {
			case wire.TKick:
				kicks.Add(1)
			case wire.TPush:
				pushes.Add(1)
			}
		}}
	}
	// Each device holds its JWT before it connects, as an app holds the
	// one its login gave it: signing is not part of what is measured.
	var tokens []string
	signAll := func() error {
		if sign == nil {
			return nil
		}
		tokens = make([]string, n)
		for i := range n {
			var err error
			if tokens[i], err = sign(devs[i].User, devs[i].ID); err != nil {
				return err
			}
		}
		return nil
	}
	if err := signAll(); err != nil {
		return err
	}
	dial := func(ctx context.Context, i int) (*client.Conn, error) {
		if sign == nil {
			return client.Dial(ctx, r.cfg.Addr, devs[i].ID, devs[i].Token, opts(i))
		}
		return client.DialJWT(ctx, r.cfg.Addr, tokens[i], opts(i))
	}
	conns := make([]*client.Conn, n)
	closeAll := func() {
		var wg sync.WaitGroup
		for part := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := part; i < n; i += 16 {
					if conns[i] != nil {
						conns[i].Close()
						conns[i] = nil
					}
				}
			}()
		}
		wg.Wait()
	}
	defer closeAll()

	// 1. Connect every device (RATE_LIMITED: after retry_after_ms, again).
	t0 = time.Now()
	var connectLimited atomic.Int64
	if err := parallel(ctx, n, connectParallel, func(i int) error {
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		start := r.clk.now()
		for {
			c, err := dial(cctx, i)
			if wait, limited := retryAfter(err); limited {
				connectLimited.Add(1)
				if !sleepCtx(cctx, wait) {
					return fmt.Errorf("connecting device %s: %w", devs[i].ID, err)
				}
				continue
			}
			if err != nil {
				return fmt.Errorf("connecting device %s: %w", devs[i].ID, err)
			}
			r.connect.Record(i, r.clk.now()-start)
			conns[i] = c
			return nil
		}
	}); err != nil {
		return err
	}
	sr.ConnectS = round3(time.Since(t0).Seconds())
	sr.ConnectLimited = connectLimited.Load()
	rep.ConnectMs = Summarize(r.connect.Total())
	fmt.Fprintf(r.cfg.Out, "connected %d devices in %.1fs (%d RATE_LIMITED answers retried)\n", n, sr.ConnectS, sr.ConnectLimited)
	if sign != nil {
		if err := makeConvs(); err != nil {
			return err
		}
	}

	// 2. Send Msgs messages to every conversation, from its members in
	// turn.
	t0 = time.Now()
	heads := make([]atomic.Int64, len(created))
	for j := range heads {
		heads[j].Store(before[j])
	}
	body := make([]byte, r.cfg.BodySize)
	var seeded, seedLimited atomic.Int64
	jobs := len(created) * r.cfg.Msgs
	if err := parallel(ctx, jobs, 64, func(job int) error {
		j, m := job/r.cfg.Msgs, job%r.cfg.Msgs
		sender := groups[j][m%len(groups[j])]
		cmid := "seed." + strconv.Itoa(j) + "." + strconv.Itoa(m)
		for {
			ok, err := conns[sender].Send(ctx, created[j].ID, cmid, body)
			if wait, limited := retryAfter(err); limited {
				seedLimited.Add(1)
				time.Sleep(wait)
				continue
			}
			if err != nil {
				return fmt.Errorf("seeding conversation %s: %w", created[j].ID, err)
			}
			storeMax(&heads[j], ok.Seq)
			seeded.Add(1)
			return nil
		}
	}); err != nil {
		return err
	}
	sr.Seeded, sr.SeedLimited = seeded.Load(), seedLimited.Load()
	sr.SeedS = round3(time.Since(t0).Seconds())
	fmt.Fprintf(r.cfg.Out, "sent %d messages in %.1fs\n", sr.Seeded, sr.SeedS)

	// 3. Drop every connection at once.
	closeAll()
	if sign != nil {
		_, devs = jwtDevices(r.cfg.Prefix, n, "b") // the storm: first logins of new devices
		if err := signAll(); err != nil {
			return err
		}
	}
	requests := make([][]wire.ConvAfter, n)
	for i, cs := range convsOf {
		for _, j := range cs {
			requests[i] = append(requests[i], wire.ConvAfter{Conv: created[j].ID, After: before[j]})
		}
	}
	convIndex := make(map[string]int, len(created))
	for j, c := range created {
		convIndex[c.ID] = j
	}

	// 4. Reconnect every device at once.
	auth, snap, total := NewHist(), NewHist(), NewHist()
	r.series = []series{{"auth", auth}, {"snapshot", snap}, {"reconnect", total}}
	var finished, failed, limited, retries, items, events, itemErrs, mismatch atomic.Int64
	var lastDone atomic.Int64
	r.line = func(pt TimelinePoint) string {
		return fmt.Sprintf("%5.2fs  finished %6d/%d  auth p99 %7.1fms  snapshot p99 %7.1fms  reconnect p99 %7.1fms  rate-limited %d  errors %d",
			pt.T, finished.Load(), n, pt.Latency["auth"].P99, pt.Latency["snapshot"].P99, pt.Latency["reconnect"].P99, limited.Load(), r.errs.Total())
	}
	reconnect := func(i int, start int64) {
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		var c *client.Conn
		for {
			var err error
			c, err = dial(sctx, i)
			if wait, ok := retryAfter(err); ok {
				limited.Add(1)
				if sleepCtx(sctx, wait) {
					retries.Add(1)
					continue
				}
			}
			if err != nil {
				r.errs.Add("AUTH_"+dialCode(err), 1)
				failed.Add(1)
				return
			}
			break
		}
		conns[i] = c
		auth.Record(i, r.clk.now()-start)
		for {
			sent := r.clk.now()
			m, err := c.Snapshot(sctx, requests[i])
			if wait, ok := retryAfter(err); ok {
				limited.Add(1)
				if sleepCtx(sctx, wait) {
					retries.Add(1)
					continue
				}
			}
			if err != nil {
				r.errs.Add("SNAPSHOT_"+errCode(err), 1)
				failed.Add(1)
				return
			}
			now := r.clk.now()
			snap.Record(i, now-sent)
			bad := false
			for _, it := range m.Items {
				items.Add(1)
				events.Add(int64(len(it.Events)))
				if it.Error != "" {
					// An item the device could not resync: the device failed.
					itemErrs.Add(1)
					r.errs.Add("ITEM_"+it.Error, 1)
					bad = true
					continue
				}
				j, ok := convIndex[it.Conv]
				want := int64(-1)
				if ok {
					want = heads[j].Load() - before[j]
				}
				if !ok || it.Head != heads[j].Load() || int64(len(it.Events))+it.Skipped != want {
					mismatch.Add(1)
				}
			}
			if len(m.Items) != len(requests[i]) {
				mismatch.Add(1)
			}
			if bad {
				failed.Add(1)
				return
			}
			total.Record(i, now-start)
			storeMax(&lastDone, now)
			finished.Add(1)
			return
		}
	}
	cpu0 := r.sampleCPU()
	self0 := selfCPU()
	mach0, machErr := machineCPU()
	gate := make(chan struct{})
	var wg sync.WaitGroup
	var start int64
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			reconnect(i, start)
		}()
	}
	start, stopSampler := r.startSampler(250 * time.Millisecond)
	close(gate)
	wg.Wait()
	end := r.clk.now()
	cpu1 := r.sampleCPU()
	self1 := selfCPU()
	mach1, _ := machineCPU()
	stopSampler()

	sr.Finished, sr.Failed = finished.Load(), failed.Load()
	sr.RateLimited, sr.Retries = limited.Load(), retries.Load()
	sr.SnapshotItems, sr.SnapshotEvents, sr.SnapshotItemErrors, sr.SnapshotMismatch = items.Load(), events.Load(), itemErrs.Load(), mismatch.Load()
	if last := lastDone.Load(); last > 0 {
		sr.WallMs = round3(float64(last-start) / 1e6)
	}
	sr.ReconnectMs, sr.AuthMs, sr.SnapshotMs = Summarize(total.Total()), Summarize(auth.Total()), Summarize(snap.Total())
	rep.Connections = n
	rep.DurationS = round3(float64(end-start) / 1e9)
	rep.Kicks = kicks.Load()
	rep.Errors = r.errs.Snapshot()
	cpu := cpuDelta(cpu0, cpu1)
	if machErr == nil {
		cpu["machine"] = mach1 - mach0
	}
	r.cpuReport(float64(end-start)/1e9, cpu, self1-self0, 0, 0)
	for _, u := range rep.CPU {
		if u.Name == "server" && sr.Finished > 0 {
			v := round3(u.CPUSeconds * 1e6 / float64(sr.Finished))
			sr.ServerCPUUsPerDevice = &v
		}
	}
	if sr.Failed > 0 {
		r.note("%d devices failed: wall_ms is the time until the last of the %d others finished", sr.Failed, sr.Finished)
	}
	if sr.SnapshotMismatch > 0 {
		r.note("%d snapshot items did not carry what was committed (head or event count)", sr.SnapshotMismatch)
	}
	r.curves()
	rep.Notes = r.notes
	return nil
}

// parallel runs f(0) … f(n-1) on at most width goroutines and returns the
// first error (after which no new calls start).
func parallel(ctx context.Context, n, width int, f func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	var stop atomic.Bool
	for range min(width, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() && ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					stop.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}
