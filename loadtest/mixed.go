package loadtest

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/wire"
)

// MixedReport is the mixed scenario's own part of the report.
type MixedReport struct {
	Users            int     `json:"users"`
	Devices          int     `json:"devices"`
	DevicesPerUser   float64 `json:"devices_per_user"`   // devices / users, as provisioned
	MultiDeviceUsers int     `json:"multi_device_users"` // users with more than one device
	DirectsPerUser   int     `json:"directs_per_user"`
	Directs          int     `json:"directs"` // direct conversations
	Groups           int     `json:"groups"`
	GroupSize        int     `json:"group_size"`
	ConvsPerUser     float64 `json:"convs_per_user"` // mean conversations per user
	MsgsPerUserPerS  float64 `json:"msgs_per_user_per_s"`
	DirectSends      int64   `json:"direct_sends"` // sends picked for a direct conversation
	GroupSends       int64   `json:"group_sends"`  // sends picked for a group

	// Read reports: a device pushed a message reads its conversation with
	// probability ReadProb ReadDelayMs (±50 %) later.
	ReadProb       float64 `json:"read_prob"`
	ReadDelayMs    float64 `json:"read_delay_ms"`
	ReadsScheduled int64   `json:"reads_scheduled"`
	Reads          int64   `json:"reads"` // read requests written
	ReadOK         int64   `json:"read_ok"`
	ReadsPerS      float64 `json:"reads_per_s"`  // read_ok / the send window
	ReadsUnsent    int64   `json:"reads_unsent"` // scheduled, not yet due or made when the drain ended
	ReadShort      int64   `json:"read_short"`   // read_ok whose read is below the seq sent (the max merge broken)
	ReadChanged    int64   `json:"read_changed"` // read_changed frames received (the user's other devices)

	// Deliveries owed to the sender's own other devices (multi-device),
	// and how many of those came as pushes.
	SiblingOwed   int64 `json:"sibling_owed"`
	SiblingPushed int64 `json:"sibling_pushed"`

	// Message features (typing, edits, clears, receipts); nil when off.
	Features *FeaturesReport `json:"features,omitempty"`
}

// mixState is the mixed scenario's part of a runner: who owns which
// device, the read scheduler and the read counters.
type mixState struct {
	// Static after setup.
	userOf []int32 // device index → user index
	devsOf []int32 // user index → how many devices
	prob   float64 // of a read per new push
	delay  int64   // nanos from the push to its read (±50 %); 0: at once
	readOK *Hist   // read → read_ok, from the read's intended time

	reads         atomic.Int64 // read requests written
	readsOK       atomic.Int64
	inflight      atomic.Int64 // reads without a reply yet
	scheduled     atomic.Int64
	short         atomic.Int64
	changed       atomic.Int64
	siblingOwed   atomic.Int64
	siblingPushed atomic.Int64

	mu      sync.Mutex // guards h
	h       readHeap
	wake    chan struct{} // cap 1: an earlier read was scheduled
	done    chan struct{} // closed by stop
	stopped chan struct{} // closed when run returns
}

// readJob is one scheduled read of conv on c, due at (unix nanos).
type readJob struct {
	at   int64
	c    *Conn
	conv string
}

// readHeap orders reads by their due time.
type readHeap []readJob

func (h readHeap) Len() int           { return len(h) }
func (h readHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h readHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *readHeap) Push(x any)        { *h = append(*h, x.(readJob)) }
func (h *readHeap) Pop() any {
	old := *h
	j := old[len(old)-1]
	old[len(old)-1] = readJob{}
	*h = old[:len(old)-1]
	return j
}

// schedule queues a read of conv on c at at.
func (m *mixState) schedule(c *Conn, conv string, at int64) {
	m.scheduled.Add(1)
	m.mu.Lock()
	heap.Push(&m.h, readJob{at: at, c: c, conv: conv})
	first := m.h[0].c == c && m.h[0].conv == conv && m.h[0].at == at
	m.mu.Unlock()
	if first {
		select {
		case m.wake <- struct{}{}:
		default:
		}
	}
}

// run fires every scheduled read when it is due, open loop (a late
// wake-up fires everything due at once, each read keeping its intended
// time), until stop.
func (m *mixState) run(r *runner) {
	defer close(m.stopped)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var due []readJob
	for {
		now := r.clk.now()
		wait := time.Hour
		due = due[:0]
		m.mu.Lock()
		for len(m.h) > 0 && m.h[0].at <= now {
			due = append(due, heap.Pop(&m.h).(readJob))
		}
		if len(m.h) > 0 {
			wait = time.Duration(m.h[0].at - now)
		}
		m.mu.Unlock()
		for _, j := range due {
			j.c.fireRead(j.conv, j.at)
		}
		if len(due) > 0 {
			continue
		}
		t.Reset(wait)
		select {
		case <-m.done:
			return
		case <-m.wake:
		case <-t.C:
		}
	}
}

// stop ends run and returns the reads still scheduled.
func (m *mixState) stop() int64 {
	close(m.done)
	<-m.stopped
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(len(m.h))
}

// idle reports whether no read is scheduled or awaiting its reply.
func (m *mixState) idle() bool {
	m.mu.Lock()
	n := len(m.h)
	m.mu.Unlock()
	return n == 0 && m.inflight.Load() == 0
}

// pushed is called for every new push of a msg event at seq in conv to
// c, sent by the device named in cmid, at now: it counts a push to a
// sibling of the sending device and maybe schedules a read.
func (c *Conn) pushed(conv, cmid string, seq, now int64) {
	m := c.r.mix
	if from, ok := cmidDevice(cmid); ok && from != c.idx && from >= 0 && from < len(m.userOf) && m.userOf[from] == m.userOf[c.idx] {
		m.siblingPushed.Add(1)
	}
	if m.prob <= 0 {
		return
	}
	c.mu.Lock()
	if want, ok := c.readWant[conv]; ok {
		c.readWant[conv] = max(want, seq)
		c.mu.Unlock()
		return
	}
	if rand.Float64() >= m.prob {
		c.mu.Unlock()
		return
	}
	if c.readWant == nil {
		c.readWant = map[string]int64{}
	}
	c.readWant[conv] = seq
	c.mu.Unlock()
	at := now
	if m.delay > 0 {
		at += m.delay/2 + rand.Int64N(m.delay) // delay ± 50 %
	}
	m.schedule(c, conv, at)
}

// cmidDevice is the device index a cmid of this tool names.
func cmidDevice(cmid string) (int, bool) {
	for i := 0; i < len(cmid); i++ {
		if cmid[i] == '.' {
			n, err := strconv.ParseInt(cmid[:i], 36, 64)
			return int(n), err == nil
		}
	}
	return 0, false
}

// fireRead sends the read of conv scheduled for intended, up to the
// newest seq pushed to c in conv since it was scheduled.
func (c *Conn) fireRead(conv string, intended int64) {
	c.mu.Lock()
	seq, ok := c.readWant[conv]
	delete(c.readWant, conv)
	c.mu.Unlock()
	if !ok {
		return
	}
	m := c.r.mix
	select {
	case <-c.c.Done():
		c.r.errs.Add("READ_CONN_CLOSED", 1)
		return
	default:
	}
	m.reads.Add(1)
	m.inflight.Add(1)
	if c.r.cfg.Client == ClientDo {
		c.r.goroutine(func() {
			rep, err := c.c.Read(c.r.ctx, conv, seq) // r.ctx ends when the runner closes
			c.readDone(rep, err, intended, seq)
		})
		return
	}
	c.mu.Lock()
	c.nextRead++
	n := c.nextRead
	req := wire.Request{T: wire.TRead, Rid: readRid(n), Conv: conv, Seq: seq}
	var err error
	if c.out, err = wire.AppendFrame(c.out, &req); err == nil {
		if c.reads == nil {
			c.reads = map[uint64]readReq{}
		}
		c.reads[n] = readReq{intended: intended, seq: seq}
	}
	c.mu.Unlock()
	if err != nil {
		m.inflight.Add(-1)
		c.r.errs.Add("READ_ENCODE", 1)
		return
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// readReq is a pipe-mode read awaiting its reply.
type readReq struct {
	intended int64 // unix nanos the read was due
	seq      int64 // the seq it reported
}

// readRid formats a pipe-mode read rid: "~" + base 36 (sends use ".",
// client.Conn plain base 36).
func readRid(n uint64) string {
	var b [16]byte
	return string(strconv.AppendUint(append(b[:0], '~'), n, 36))
}

// isReadRid reports whether rid is a read's.
func isReadRid(rid string) bool { return len(rid) > 1 && rid[0] == '~' }

// readReply handles a pipe-mode read's reply (read_ok or error).
func (c *Conn) readReply(msg wire.Message) {
	n, err := strconv.ParseUint(msg.Rid[1:], 36, 64)
	c.mu.Lock()
	req, ok := c.reads[n]
	delete(c.reads, n)
	c.mu.Unlock()
	if err != nil || !ok {
		c.r.badReplies.Add(1)
		return
	}
	var rerr error
	if msg.T == wire.TError {
		rerr = msg.Err()
	}
	c.readDone(msg, rerr, req.intended, req.seq)
}

// readDone records a read's outcome.
func (c *Conn) readDone(msg wire.Message, err error, intended, seq int64) {
	m := c.r.mix
	defer m.inflight.Add(-1) // after the outcome is recorded: see onFrame
	if err != nil {
		c.r.errs.Add("READ_"+errCode(err), 1)
		return
	}
	m.readOK.Record(c.idx, c.r.clk.now()-intended)
	m.readsOK.Add(1)
	if msg.Read < seq {
		m.short.Add(1)
	}
	c.afterReadOK(msg.Conv, msg.Read)
}

// unansweredReads counts the pipe-mode reads still waiting for a reply.
func (c *Conn) unansweredReads() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int64(len(c.reads))
}

// validateMixed checks the mixed scenario's settings.
func (c *Config) validateMixed(bad func(string, ...any)) {
	if c.Users < 2 || c.Users > MaxConns {
		bad("users must be 2 to %d", MaxConns)
		return
	}
	if !(c.DevicesPerUser >= 1 && c.DevicesPerUser <= MaxDevicesPerUser) {
		bad("devices per user must be 1 to %d", MaxDevicesPerUser)
	} else if n := math.Round(float64(c.Users) * c.DevicesPerUser); n > MaxConns {
		bad("users × devices per user is %.0f devices: at most %d", n, MaxConns)
	}
	if c.Directs >= c.Users {
		bad("directs (direct conversations per user) must be below users")
	}
	if c.Directs > 0 && c.Directs%2 == 1 && c.Users%2 == 1 {
		bad("an odd number of directs per user needs an even number of users")
	}
	if c.Directs < 0 && c.Groups < 0 {
		bad("mixed needs direct conversations or groups")
	}
	if c.Groups > 0 && c.Size > c.Users {
		bad("size (group members) must be at most users")
	}
	if c.ReadProb > 1 {
		bad("read-prob must be at most 1")
	}
	if c.ReadDelay > time.Minute {
		bad("read-delay must be at most 1m")
	}
}

// devicesPerUser spreads round(users × d) devices over users: user i
// gets round((i+1)·d) − round(i·d), which is ⌊d⌋ or ⌈d⌉.
func devicesPerUser(users int, d float64) []int32 {
	out := make([]int32, users)
	prev := 0
	for i := range out {
		next := int(math.Round(float64(i+1) * d))
		out[i] = int32(next - prev)
		prev = next
	}
	return out
}

// directPairs returns users·k/2 distinct pairs over a random permutation
// of the users in which every user is in exactly k pairs: each user
// paired with the users 1 … k/2 places after it on a ring, and for odd k
// (users even) with the one opposite. It needs k < users.
func directPairs(users, k int, rng *rand.Rand) [][2]int32 {
	perm := rng.Perm(users)
	var out [][2]int32
	for o := 1; o <= k/2; o++ {
		for i := range users {
			out = append(out, [2]int32{int32(perm[i]), int32(perm[(i+o)%users])})
		}
	}
	if k%2 == 1 {
		for i := range users / 2 {
			out = append(out, [2]int32{int32(perm[i]), int32(perm[i+users/2])})
		}
	}
	return out
}

// groupMembers draws groups groups of size distinct users each, at random.
func groupMembers(users, groups, size int, rng *rand.Rand) [][]int32 {
	out := make([][]int32, groups)
	mark := make([]int32, users) // user → the last group (+1) that drew it
	for g := range out {
		members := make([]int32, 0, size)
		for len(members) < size {
			u := rng.IntN(users)
			if mark[u] == int32(g+1) {
				continue
			}
			mark[u] = int32(g + 1)
			members = append(members, int32(u))
		}
		out[g] = members
	}
	return out
}

// runMixed is scenario mixed, a load model of a mobile user base: Users
// users with DevicesPerUser devices each on average, all connected; each
// user in Directs direct conversations and in the groups (Groups of
// Size, members drawn at random). Send k goes from a random user (of
// those with a conversation) to one of its conversations, from one of
// its devices; each confirmed send is owed a push to every other member
// device, the sender's own other devices included. A device pushed a
// message reads the conversation later (ReadProb, ReadDelay).
func runMixed(ctx context.Context, r *runner) error {
	if err := r.checkFDs(); err != nil {
		return err
	}
	cfg := r.cfg
	nu := cfg.Users
	rng := rand.New(rand.NewPCG(0x6d1, 0x5eed))
	t0 := time.Now()

	devsOf := devicesPerUser(nu, cfg.DevicesPerUser)
	users, _, err := r.provisionUsers(ctx, nu, 0)
	if err != nil {
		return err
	}
	first := make([]int, nu) // user → its first device index
	var devs []Device
	var userOf []int32
	multi := 0
	for u, n := range devsOf {
		first[u] = len(devs)
		if n > 1 {
			multi++
		}
		for range n {
			devs = append(devs, Device{ID: cfg.Prefix + "d" + strconv.Itoa(len(devs)), User: users[u]})
			userOf = append(userOf, int32(u))
		}
	}
	if devs, err = r.admin.Devices(ctx, devs); err != nil {
		return fmt.Errorf("provisioning devices: %w", err)
	}

	var pairs [][2]int32
	if cfg.Directs > 0 {
		pairs = directPairs(nu, cfg.Directs, rng)
	}
	var groups [][]int32
	if cfg.Groups > 0 {
		groups = groupMembers(nu, cfg.Groups, cfg.Size, rng)
	}
	specs := make([]ConvSpec, 0, len(pairs)+len(groups))
	members := make([][]int32, 0, len(pairs)+len(groups)) // conversation → member users
	for _, p := range pairs {
		specs = append(specs, ConvSpec{Kind: "direct", Members: []string{users[p[0]], users[p[1]]}})
		members = append(members, p[:])
	}
	for j, g := range groups {
		ms := make([]string, len(g))
		for i, u := range g {
			ms[i] = users[u]
		}
		specs = append(specs, ConvSpec{ID: cfg.Prefix + "m" + strconv.Itoa(j), Kind: "group", Members: ms})
		members = append(members, g)
	}
	convs, err := r.admin.Conversations(ctx, specs)
	if err != nil {
		return fmt.Errorf("provisioning conversations: %w", err)
	}
	tracks := make([]*convTrack, len(convs))
	convsOf := make([][]int32, nu) // user → its conversations
	memberships := 0
	for j, c := range convs {
		var ids []string
		for _, u := range members[j] {
			for d := first[u]; d < first[u]+int(devsOf[u]); d++ {
				ids = append(ids, devs[d].ID)
			}
			convsOf[u] = append(convsOf[u], int32(j))
			memberships++
		}
		tracks[j] = r.tracker.Track(c.ID, c.Head, ids...)
	}
	fmt.Fprintf(r.cfg.Out, "provisioned %d users, %d devices (%d users with several), %d direct conversations, %d groups of %d in %s (prefix %s)\n",
		nu, len(devs), multi, len(pairs), len(groups), cfg.Size, time.Since(t0).Round(time.Millisecond), cfg.Prefix)

	delay := int64(max(cfg.ReadDelay, 0))
	mix := &mixState{userOf: userOf, devsOf: devsOf, prob: max(cfg.ReadProb, 0), delay: delay, readOK: NewHist(),
		wake: make(chan struct{}, 1), done: make(chan struct{}), stopped: make(chan struct{})}
	r.mix = mix
	if !cfg.NoFeatures {
		r.features = &featureMix{typingProb: max(cfg.TypingProb, 0), editProb: max(cfg.EditProb, 0),
			clearProb: max(cfg.ClearProb, 0), receiptsProb: max(cfg.ReceiptsProb, 0)}
	}

	t0 = time.Now()
	conns, err := r.connectAll(ctx, devs, func(i int) []*convTrack {
		var ts []*convTrack
		for _, j := range convsOf[userOf[i]] {
			ts = append(ts, tracks[j])
		}
		return ts
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(r.cfg.Out, "connected %d devices in %s\n", len(devs), time.Since(t0).Round(time.Millisecond))

	var senders []int // users with a conversation
	for u := range nu {
		if len(convsOf[u]) > 0 {
			senders = append(senders, u)
		}
	}
	mr := &MixedReport{Users: nu, Devices: len(devs), DevicesPerUser: round3(float64(len(devs)) / float64(nu)), MultiDeviceUsers: multi,
		DirectsPerUser: max(cfg.Directs, 0), Directs: len(pairs), Groups: len(groups), GroupSize: cfg.Size,
		ConvsPerUser: round3(float64(memberships) / float64(nu)), MsgsPerUserPerS: round3(cfg.Rate / float64(nu)),
		ReadProb: mix.prob, ReadDelayMs: round3(float64(delay) / 1e6)}
	r.report.Mixed = mr
	r.report.Connections = len(devs)
	r.series = []series{{"send_ok", r.sendOK}, {"push", r.push}}
	if mix.prob > 0 {
		r.series = append(r.series, series{"read_ok", mix.readOK})
	}

	// The pacer calls fire from one goroutine: rng needs no lock.
	nDirect := len(pairs)
	r.load(ctx, func(k, intended int64) {
		u := senders[rng.IntN(len(senders))]
		cs := convsOf[u]
		j := cs[rng.IntN(len(cs))]
		d := first[u] + rng.IntN(int(devsOf[u]))
		if int(j) < nDirect {
			mr.DirectSends++
		} else {
			mr.GroupSends++
		}
		conns[d].beforeSend(tracks[j].id)
		conns[d].send(tracks[j].id, k, intended)
	})
	return nil
}

// finishMixed fills the mixed report's read and multi-device figures
// (called by finish, after the drain).
func (r *runner) finishMixed(window float64) {
	m, mr, w := r.mix, r.report.Mixed, r.warm
	mr.ReadsScheduled, mr.Reads, mr.ReadOK = m.scheduled.Load()-w.readsScheduled, m.reads.Load()-w.reads, m.readsOK.Load()-w.readsOK
	mr.ReadShort, mr.ReadChanged = m.short.Load()-w.readShort, m.changed.Load()-w.readChanged
	mr.SiblingOwed, mr.SiblingPushed = m.siblingOwed.Load()-w.siblingOwed, m.siblingPushed.Load()-w.siblingPushed
	if window > 0 {
		mr.ReadsPerS = round3(float64(mr.ReadOK) / window)
	}
	r.report.ReadsPerS = &mr.ReadsPerS
	if r.features != nil {
		mr.Features = r.features.report()
	}
	s := Summarize(m.readOK.Total())
	r.report.ReadOKMs = &s
	if mr.ReadsUnsent > 0 {
		r.note("%d reads were still scheduled when the drain ended (-read-delay against -drain)", mr.ReadsUnsent)
	}
	if mr.ReadShort > 0 {
		r.note("%d read_ok replies carried a read position below the seq the device reported (read must only grow)", mr.ReadShort)
	}
}
