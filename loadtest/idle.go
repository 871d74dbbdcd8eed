package loadtest

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/wire"
)

// IdleReport is the result of scenario idle.
type IdleReport struct {
	Conns         int     `json:"conns"`     // connections asked for
	Connected     int64   `json:"connected"` // connections authenticated
	Failed        int64   `json:"failed"`    // connections that could not be made (by code in errors)
	Dropped       int64   `json:"dropped"`   // connections that ended during the hold
	ConnectS      float64 `json:"connect_s"` // time to connect them all
	HoldS         float64 `json:"hold_s"`
	PingIntervalS float64 `json:"ping_interval_s"`
	Pings         int64   `json:"pings"` // pongs received during the hold
	Kicks         int64   `json:"kicks"`

	// The server's resident memory before connecting, right after the
	// last connection authenticated, and at the end of the hold; per
	// connection is (end − before) / connected.
	RSSSource             string  `json:"rss_source"` // /proc/PID/status or the metrics URL
	ServerRSSBefore       int64   `json:"server_rss_before_bytes"`
	ServerRSSConnected    int64   `json:"server_rss_connected_bytes"`
	ServerRSSAfter        int64   `json:"server_rss_after_bytes"`
	RSSPerConnBytes       float64 `json:"rss_per_conn_bytes"`
	ServerConnectionGauge *int64  `json:"server_connections,omitempty"` // parley_gateway_connections at the end of the hold (with -metrics)

	// The load tool's own resident memory, the same way.
	ToolRSSBefore       int64   `json:"tool_rss_before_bytes"`
	ToolRSSAfter        int64   `json:"tool_rss_after_bytes"`
	ToolRSSPerConnBytes float64 `json:"tool_rss_per_conn_bytes"`

	ServerCoresHold *float64 `json:"server_cores_hold"` // CPU the server spent holding (and ponging) them, in cores
}

// idleConn is one idle device: a bare authenticated socket, with no
// goroutine and no buffer of its own (the pingers share theirs), so the
// tool holds tens of thousands in a few MB.
type idleConn struct {
	nc   net.Conn
	idx  int
	dead bool // owned by the pinger that owns the connection
}

// idleRid is the rid of idle pings and auths: replies are read in order,
// so one rid serves.
const idleRid = "i"

// readFrame reads one frame into buf (grown if needed) and decodes it.
func readFrame(nc net.Conn, buf *[]byte) (wire.Message, error) {
	var hdr [wire.HeaderLen]byte
	if _, err := io.ReadFull(nc, hdr[:]); err != nil {
		return wire.Message{}, err
	}
	n := int(binary.BigEndian.Uint32(hdr[:]))
	if n == 0 || n > 16<<20 {
		return wire.Message{}, fmt.Errorf("bad frame length %d", n)
	}
	if cap(*buf) < n {
		*buf = make([]byte, n)
	}
	b := (*buf)[:n]
	if _, err := io.ReadFull(nc, b); err != nil {
		return wire.Message{}, err
	}
	return wire.DecodeMessage(b)
}

// roundTrip writes frame and reads frames until the reply with idleRid
// (an error frame with it comes back as *wire.Error). kicks counts kick
// frames met on the way.
func roundTrip(nc net.Conn, frame []byte, buf *[]byte, timeout time.Duration, kicks *atomic.Int64) (wire.Message, error) {
	_ = nc.SetDeadline(time.Now().Add(timeout))
	if _, err := nc.Write(frame); err != nil {
		return wire.Message{}, err
	}
	for {
		m, err := readFrame(nc, buf)
		if err != nil {
			return m, err
		}
		if m.T == wire.TKick && kicks != nil {
			kicks.Add(1)
		}
		if m.Rid != idleRid {
			continue
		}
		if m.T == wire.TError {
			return m, m.Err()
		}
		return m, nil
	}
}

// idleParallel is how many idle connections are made at once, and how
// many goroutines ping them.
const (
	idleParallel = 64
	idlePingers  = 16
)

// runIdle is scenario idle: Conns devices (users with one device each, no
// conversations) connect with bare sockets, authenticate, and ping every
// PingInterval (spread evenly) for Duration. It reports the server's RSS
// per connection (from /proc/ServerPID/status, or the metrics listener's
// process_resident_memory_bytes), the tool's own, and ping latency.
func runIdle(ctx context.Context, r *runner) error {
	if err := r.checkFDs(); err != nil {
		return err
	}
	n := r.cfg.Conns
	if err := r.checkConns(n, n); err != nil {
		return err
	}
	rss, source, err := r.serverRSSReader()
	if err != nil {
		return err
	}
	rep := r.report
	ir := &IdleReport{Conns: n, RSSSource: source, PingIntervalS: r.cfg.PingInterval.Seconds()}
	rep.Idle = ir
	rep.RunPrefix, rep.Addr, rep.Transport, rep.Sources, rep.FDLimit = r.cfg.Prefix, r.cfg.Addr, r.cfg.Transport, r.cfg.Sources, r.fdLimit

	t0 := time.Now()
	_, devs, err := r.provisionUsers(ctx, n, n)
	if err != nil {
		return err
	}
	fmt.Fprintf(r.cfg.Out, "provisioned %d users and devices in %s (prefix %s)\n", n, time.Since(t0).Round(time.Millisecond), r.cfg.Prefix)

	ping := NewHist()
	r.rss = rss
	r.series = []series{{"connect", r.connect}, {"ping", ping}}
	var connected, pings, dropped, kicks atomic.Int64
	r.line = func(pt TimelinePoint) string {
		return fmt.Sprintf("%5.1fs  connected %6d  pings %5d/s  connect p99 %7.2fms  ping p99 %7.2fms  dropped %d  errors %d",
			pt.T, connected.Load(), pt.Latency["ping"].N, pt.Latency["connect"].P99, pt.Latency["ping"].P99, dropped.Load(), r.errs.Total())
	}

	// Memory before: settle the server's heap first (a GC happens at
	// most every 2 minutes on an idle Go server; RSS includes garbage).
	runtime.GC()
	toolBefore, _ := procRSS(0)
	ir.ToolRSSBefore = toolBefore
	if ir.ServerRSSBefore, err = rss(ctx); err != nil {
		return fmt.Errorf("reading the server's RSS: %w", err)
	}

	start, stopSampler := r.startSampler(time.Second)
	defer stopSampler()
	conns := make([]*idleConn, n)
	dialers := r.dialers()
	authFrames := make([][]byte, n)
	for i, d := range devs {
		authFrames[i], _ = wire.AppendFrame(nil, wire.Request{T: wire.TAuth, Rid: idleRid, Device: d.ID, Token: d.Token})
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(idleParallel, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				t := r.clk.now()
				var nc net.Conn
				// RATE_LIMITED (the gateway's auth_rate) is answered like a
				// client would: a new connection after retry_after_ms.
				for attempt := 0; ; attempt++ {
					dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					c, err := r.dialStream(dctx, dialers[i%len(dialers)])
					cancel()
					if err != nil {
						r.errs.Add("DIAL", 1)
						break
					}
					_, err = roundTrip(c, authFrames[i], &buf, 15*time.Second, &kicks)
					if wait, limited := retryAfter(err); limited && attempt < maxAuthRetries {
						c.Close()
						r.connectLimited.Add(1)
						if !sleepCtx(ctx, wait) {
							break
						}
						continue
					}
					if err != nil {
						r.errs.Add("AUTH_"+errCode(err), 1)
						c.Close()
						break
					}
					nc = c
					break
				}
				if nc == nil {
					continue
				}
				_ = nc.SetDeadline(time.Time{})
				r.connect.Record(i, r.clk.now()-t)
				conns[i] = &idleConn{nc: nc, idx: i}
				connected.Add(1)
			}
		}()
	}
	wg.Wait()
	authFrames = nil
	ir.Connected = connected.Load()
	ir.Failed = int64(n) - ir.Connected
	ir.ConnectS = round3(float64(r.clk.now()-start) / 1e9)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.nc.Close()
			}
		}
	}()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	r.report.ConnectRateLimited = r.connectLimited.Load()
	fmt.Fprintf(r.cfg.Out, "connected %d of %d in %.1fs (%d RATE_LIMITED answers retried)\n", ir.Connected, n, ir.ConnectS, r.report.ConnectRateLimited)
	if ir.ServerRSSConnected, err = rss(ctx); err != nil {
		r.note("reading the server's RSS after connecting: %v", err)
	}

	// Hold: pingers own a stride of the connections each; connection i
	// pings at holdStart + phase(i) + j·interval, so pings are spread
	// evenly. A ping's latency counts from its intended time.
	cpu0 := r.sampleCPU()
	self0 := selfCPU()
	mach0, machErr := machineCPU()
	holdStart := r.clk.now()
	holdEnd := holdStart + int64(r.cfg.Duration)
	interval := int64(r.cfg.PingInterval)
	pingFrame, _ := wire.AppendFrame(nil, wire.Request{T: wire.TPing, Rid: idleRid})
	for p := range min(idlePingers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			var mine []*idleConn
			for i := p; i < n; i += idlePingers {
				if conns[i] != nil {
					mine = append(mine, conns[i])
				}
			}
			if len(mine) == 0 {
				return
			}
			// Connection j of mine (global index c.idx) has phase
			// c.idx/n of the interval.
			for round := int64(0); ; round++ {
				for _, c := range mine {
					due := holdStart + round*interval + interval*int64(c.idx)/int64(n)
					if due >= holdEnd {
						return
					}
					if c.dead {
						continue
					}
					if d := due - r.clk.now(); d > 0 {
						select {
						case <-time.After(time.Duration(d)):
						case <-ctx.Done():
							return
						}
					}
					if _, err := roundTrip(c.nc, pingFrame, &buf, 10*time.Second, &kicks); err != nil {
						c.dead = true
						dropped.Add(1)
						r.errs.Add("PING_"+errCode(err), 1)
						continue
					}
					ping.Record(c.idx, r.clk.now()-due)
					pings.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	holdStop := r.clk.now()
	cpu1 := r.sampleCPU()
	self1 := selfCPU()
	mach1, _ := machineCPU()
	stopSampler()

	if ir.ServerRSSAfter, err = rss(ctx); err != nil {
		return fmt.Errorf("reading the server's RSS: %w", err)
	}
	runtime.GC()
	toolAfter, _ := procRSS(0)
	ir.ToolRSSAfter = toolAfter
	if ir.Connected > 0 {
		ir.RSSPerConnBytes = round3(float64(ir.ServerRSSAfter-ir.ServerRSSBefore) / float64(ir.Connected))
		ir.ToolRSSPerConnBytes = round3(float64(ir.ToolRSSAfter-ir.ToolRSSBefore) / float64(ir.Connected))
	}
	if r.cfg.MetricsURL != "" {
		if v, err := scrapeMetric(ctx, r.cfg.MetricsURL, "parley_gateway_connections"); err == nil {
			g := int64(v)
			ir.ServerConnectionGauge = &g
		}
	}
	ir.HoldS = round3(float64(holdStop-holdStart) / 1e9)
	ir.Pings, ir.Dropped, ir.Kicks = pings.Load(), dropped.Load(), kicks.Load()
	rep.Connections = int(ir.Connected)
	rep.DurationS = ir.HoldS
	rep.ConnectMs = Summarize(r.connect.Total())
	rep.Errors = r.errs.Snapshot()
	cpu := cpuDelta(cpu0, cpu1)
	if machErr == nil {
		cpu["machine"] = mach1 - mach0
	}
	r.cpuReport(float64(holdStop-holdStart)/1e9, cpu, self1-self0, 0, 0)
	for _, u := range rep.CPU {
		if u.Name == "server" {
			c := u.Cores
			ir.ServerCoresHold = &c
		}
	}
	if ir.Failed > 0 {
		r.note("%d of %d connections could not be made (see errors)", ir.Failed, n)
	}
	r.curves()
	rep.Notes = r.notes
	return nil
}

// serverRSSReader returns how to read the server's RSS: /proc/PID/status
// with -server-pid, else the metrics listener's
// process_resident_memory_bytes.
func (r *runner) serverRSSReader() (func(context.Context) (int64, error), string, error) {
	if pid := r.cfg.ServerPID; pid > 0 {
		if _, err := procRSS(pid); err != nil {
			return nil, "", fmt.Errorf("reading the server's RSS: %w", err)
		}
		return func(context.Context) (int64, error) { return procRSS(pid) }, fmt.Sprintf("/proc/%d/status", pid), nil
	}
	if u := r.cfg.MetricsURL; u != "" {
		read := func(ctx context.Context) (int64, error) {
			v, err := scrapeMetric(ctx, u, "process_resident_memory_bytes")
			return int64(v), err
		}
		if _, err := read(context.Background()); err != nil {
			return nil, "", err
		}
		return read, strings.TrimRight(u, "/") + "/metrics", nil
	}
	return nil, "", errors.New("idle needs -server-pid or -metrics to read the server's memory")
}

// scrapeMetric reads one unlabelled sample from base/metrics (Prometheus
// text format).
func scrapeMetric(ctx context.Context, base, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("scraping %s: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("scraping %s: status %d", base, resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(rest), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("scraping %s: %w", base, err)
	}
	return 0, fmt.Errorf("%s/metrics has no %s", base, name)
}
