package loadtest

import (
	"context"
	"time"
)

// load runs the measured part of a run: it samples CPU, fires sends on the
// clock for the configured duration (pace), waits for the replies and
// pushes still owed (drain), samples CPU again, and fills r.report.
// fire(k, intended) must issue the k-th send, meant to start at intended
// (unix nanos), without waiting for anything.
func (r *runner) load(ctx context.Context, fire func(k, intended int64)) {
	if r.series == nil {
		r.series = []series{{"send_ok", r.sendOK}, {"push", r.push}}
	}
	r.probes.start(r)
	_, stopSampler := r.startSampler(time.Second)
	r.acking.Store(r.cfg.AckDelay > 0)
	keepDone := make(chan struct{})
	r.goroutine(func() { r.keepalive(keepDone) })
	syncCtx, stopSync := context.WithCancel(r.ctx)
	for range syncers {
		r.goroutine(func() { r.syncer(syncCtx) })
	}
	if r.mix != nil {
		r.goroutine(func() { r.mix.run(r) })
	}
	if r.cfg.Warmup > 0 {
		r.warmup(ctx, fire)
	}
	wal0, walOK := r.probes.readWAL(ctx)
	cpu0 := r.sampleCPU()
	self0 := selfCPU()
	mach0, machErr := machineCPU()

	// The moderator works during the window only, and its replies are in
	// before the drain starts.
	modStop, modDone := make(chan struct{}), make(chan struct{})
	if m := r.moderator; m != nil {
		go func() {
			defer close(modDone)
			m.run(modStop)
		}()
	} else {
		close(modDone)
	}
	start, end := r.pace(ctx, fire, r.warm.sends, r.cfg.Duration)
	close(modStop)
	<-modDone
	drainEnd := r.drain(ctx)
	if r.mix != nil {
		r.report.Mixed.ReadsUnsent = r.mix.stop()
	}
	r.acking.Store(false)
	close(keepDone)
	stopSync()

	cpu1 := r.sampleCPU()
	self1 := selfCPU()
	mach1, _ := machineCPU()
	wal1, walOK1 := r.probes.readWAL(ctx)
	stopSampler()
	r.probes.stopLoops()
	r.verifyLost(ctx)
	cpu := cpuDelta(cpu0, cpu1)
	if machErr == nil {
		cpu["machine"] = mach1 - mach0
	}
	r.finish(start, end, drainEnd, cpu, self1-self0)
	if walOK && walOK1 {
		r.report.WAL = walUse(wal0, wal1, r.report.Confirmed)
	}
}

// pace calls fire for k = k0, k0+1, … k0+n-1 (n = rate × d) at the
// intended times start + (k-k0)/rate, from this goroutine: open loop, the
// schedule never waits for a reply. When the pacer wakes up late it fires
// everything already due at once, each send keeping its own intended
// time, so the delay counts in every latency. It returns the window.
func (r *runner) pace(ctx context.Context, fire func(k, intended int64), k0 int64, d time.Duration) (start, end int64) {
	rate := r.cfg.Rate
	n := r.sendsIn(d)
	at := func(i int64) int64 { return start + int64(float64(i)*1e9/rate) }
	start = r.clk.now()
	for i := int64(0); i < n && ctx.Err() == nil; {
		now := r.clk.now()
		due := min(n, int64(float64(now-start)*rate/1e9)+1)
		for ; i < due; i++ {
			intended := at(i)
			r.lag.Record(0, r.clk.now()-intended)
			fire(k0+i, intended)
		}
		if i < n {
			if d := at(i) - r.clk.now(); d > 0 {
				time.Sleep(time.Duration(d))
			}
		}
	}
	end = max(r.clk.now(), start+int64(d))
	return start, end
}

// sendsIn is how many sends pace fires in d.
func (r *runner) sendsIn(d time.Duration) int64 { return int64(r.cfg.Rate * d.Seconds()) }

// warmCounts are the run's counts when the warm-up ended.
type warmCounts struct {
	sends, sent, confirmed, delivered, synced, syncs, acks, hints int64
	// Scenario mixed.
	readsScheduled, reads, readsOK, readShort, readChanged, siblingOwed, siblingPushed int64
	// Scenario typing.
	typing, typingIn int64
}

// warmup sends for Config.Warmup as the window will (so the server's
// pools, caches and plans are warm when the window starts), waits for the
// replies and pushes owed, then forgets the latencies it recorded and
// remembers the counts so the report leaves them out.
func (r *runner) warmup(ctx context.Context, fire func(k, intended int64)) {
	r.note("the first %s were a warm-up: latencies, rates and CPU are of the window after it; lost and duplicated count both", r.cfg.Warmup)
	r.pace(ctx, fire, 0, r.cfg.Warmup)
	r.drain(ctx)
	for _, s := range r.series {
		s.h.Reset()
	}
	r.lag.Reset()
	t := r.tracker
	r.warm = warmCounts{sends: r.sendsIn(r.cfg.Warmup), sent: r.sent.Load(), confirmed: t.confirmed.Load(),
		delivered: t.delivered.Load(), synced: t.synced.Load(), syncs: r.syncs.Load(), acks: r.acks.Load(), hints: r.hints.Load()}
	if m := r.mix; m != nil {
		// fire (on this goroutine) counts the sends of each kind.
		r.report.Mixed.DirectSends, r.report.Mixed.GroupSends = 0, 0
		m.readOK.Reset()
		r.warm.readsScheduled, r.warm.reads, r.warm.readsOK = m.scheduled.Load(), m.reads.Load(), m.readsOK.Load()
		r.warm.readShort, r.warm.readChanged = m.short.Load(), m.changed.Load()
		r.warm.siblingOwed, r.warm.siblingPushed = m.siblingOwed.Load(), m.siblingPushed.Load()
	}
	if f := r.features; f != nil {
		r.warm.typing, r.warm.typingIn = f.typing.Load(), f.typingIn.Load()
	}
}

// drain waits for every reply and every owed push (and, in mixed, every
// scheduled read and its reply) for as long as they keep coming: it gives
// up once cfg.Drain passes with no reply, push or sync arriving, and at
// most maxDrain (or cfg.Drain, if longer) after the window. It returns
// when it stopped waiting. A server past its peak may still be answering
// seconds of backlog when the window ends; a fixed wait counted what it
// had not answered yet as lost.
func (r *runner) drain(ctx context.Context) int64 {
	start := r.clk.now()
	limit := start + max(int64(maxDrain), int64(r.cfg.Drain))
	quietUntil := start + int64(r.cfg.Drain)
	last := r.drainProgress()
	for now := start; now < quietUntil && now < limit && ctx.Err() == nil; now = r.clk.now() {
		if r.inflight.Load() == 0 && r.tracker.Matched() && (r.mix == nil || r.mix.idle()) {
			if _, lost, _ := r.tracker.Check(0); lost == 0 {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
		if p := r.drainProgress(); p != last {
			last, quietUntil = p, r.clk.now()+int64(r.cfg.Drain)
		}
	}
	return r.clk.now()
}

// maxDrain bounds how long drain waits while answers keep arriving.
const maxDrain = 60 * time.Second

// progress is what drain watches for answers arriving.
type progress struct{ inflight, confirmed, delivered, reads int64 }

func (r *runner) drainProgress() progress {
	p := progress{r.inflight.Load(), r.tracker.confirmed.Load(), r.tracker.delivered.Load(), 0}
	if r.mix != nil {
		p.reads = r.mix.readsOK.Load()
	}
	return p
}

// syncers is how many goroutines sync hinted conversations.
const syncers = 4

// syncer syncs the conversations of hinted connections until ctx ends.
func (r *runner) syncer(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-r.syncQ:
			c.syncHinted(ctx)
		}
	}
}

// keepaliveEvery is how often every connection pings during a load (the
// server's idle_timeout defaults to 90 s).
const keepaliveEvery = 30 * time.Second

// keepalive pings every connection every keepaliveEvery until done, so
// that devices that only receive (and never ack, with -ack 0) do not reach
// the server's idle_timeout in a long run.
func (r *runner) keepalive(done <-chan struct{}) {
	t := time.NewTicker(keepaliveEvery)
	defer t.Stop()
	r.mu.Lock()
	conns := r.conns
	r.mu.Unlock()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		for _, c := range conns {
			c.ping()
		}
	}
}

// cpuSample is the CPU time of each watched process tree, by name, and
// pid → CPU time for each tree.
type cpuSample map[string]map[int]time.Duration

// watched returns the processes whose CPU the report shows: "server"
// (-server-pid) and the -cpu ones.
func (r *runner) watched() map[string]int {
	w := map[string]int{}
	if r.cfg.ServerPID > 0 {
		w["server"] = r.cfg.ServerPID
	}
	for name, pid := range r.cfg.CPUPIDs {
		w[name] = pid
	}
	return w
}

func (r *runner) sampleCPU() cpuSample {
	s := cpuSample{}
	for name, pid := range r.watched() {
		if m, err := treeCPU(pid); err == nil {
			s[name] = m
		}
	}
	if r.probes != nil && len(r.probes.backends) > 0 {
		// The commit probe's backends (children of a watched postmaster)
		// count as "pg-probe", not as the server's PostgreSQL: at 200
		// commits/s they are a tenth of a core on a slow host.
		probe := map[int]time.Duration{}
		for _, pid := range r.probes.backends {
			for _, tree := range s {
				if t, ok := tree[pid]; ok {
					probe[pid] = t
					delete(tree, pid)
				}
			}
		}
		if len(probe) > 0 {
			s[probeCPUName] = probe
		}
	}
	return s
}

// probeCPUName is the report's CPU entry of the commit probe's
// PostgreSQL backends.
const probeCPUName = "pg-probe"

// cpuDelta is the CPU used between two samples, per name: the sum over
// processes present in the second sample (those that started meanwhile
// count whole; those that exited meanwhile are missed).
func cpuDelta(a, b cpuSample) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, after := range b {
		before, ok := a[name]
		if !ok {
			continue
		}
		var d time.Duration
		for pid, t := range after {
			d += t - before[pid]
		}
		out[name] = d
	}
	return out
}
