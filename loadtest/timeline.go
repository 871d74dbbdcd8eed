package loadtest

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// series is one latency metric the timeline samples and the report
// charts: a name ("send_ok", "push", "ping", …) and its histogram.
type series struct {
	name string
	h    *Hist
}

// TimelinePoint is one interval of the run (a second, or less for short
// scenarios): the throughput and the latency percentiles of what was
// recorded in it (by the time a reply or push arrived).
type TimelinePoint struct {
	T          float64 `json:"t"` // seconds since the start, at the interval's end
	Sends      float64 `json:"sends_per_s,omitempty"`
	Confirmed  float64 `json:"confirmed_per_s,omitempty"`
	Deliveries float64 `json:"deliveries_per_s,omitempty"`
	Reads      float64 `json:"reads_per_s,omitempty"`      // mixed: read_ok replies
	ServerRSS  int64   `json:"server_rss_bytes,omitempty"` // idle: the server's RSS at the interval's end
	// FanoutBacklog is parley_fanout_backlog at the interval's end (with
	// -metrics): row-write jobs waiting in the server's fan-out stream.
	FanoutBacklog *int64                 `json:"fanout_backlog,omitempty"`
	Latency       map[string]IntervalPct `json:"latency_ms"`
}

// IntervalPct is one metric's percentiles over one interval, in ms.
type IntervalPct struct {
	N   int64   `json:"n"`
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// CurvePoint is one point of a latency distribution: the latency (ms) at
// a percentile.
type CurvePoint struct {
	P  float64 `json:"p"`
	Ms float64 `json:"ms"`
}

// Curve is a latency distribution from an HDR histogram of µs: the value
// at percentiles 0, 90, 99, 99.9, … (twenty points per decade of 1/(1−p),
// up to one in the count), and the maximum at 100.
func Curve(h *hdrhistogram.Histogram) []CurvePoint {
	n := h.TotalCount()
	if n == 0 {
		return nil
	}
	var out []CurvePoint
	top := math.Log10(float64(n))
	for x := 0.0; x <= top; x += 0.05 {
		p := 100 * (1 - math.Pow(10, -x))
		out = append(out, CurvePoint{P: math.Round(p*1e4) / 1e4, Ms: round3(float64(h.ValueAtQuantile(p)) / 1000)})
	}
	return append(out, CurvePoint{P: 100, Ms: round3(float64(h.Max()) / 1000)})
}

// sampler closes an interval every tick until done is closed: it appends
// a TimelinePoint (throughput and each series' percentiles since the
// previous tick) and prints the live line. It is the only consumer of the
// series' interval histograms.
func (r *runner) sampler(start int64, tick time.Duration, done <-chan struct{}, stopped chan<- struct{}) {
	defer close(stopped)
	t := time.NewTicker(tick)
	defer t.Stop()
	var lastSent, lastConf, lastDeliv, lastReads int64
	last := start
	sample := func() {
		now := r.clk.now()
		dt := float64(now-last) / 1e9
		if dt <= 0 {
			return
		}
		last = now
		sent, conf, deliv := r.sent.Load(), r.tracker.confirmed.Load(), r.tracker.delivered.Load()
		pt := TimelinePoint{T: round3(float64(now-start) / 1e9), Latency: map[string]IntervalPct{},
			Sends: round3(float64(sent-lastSent) / dt), Confirmed: round3(float64(conf-lastConf) / dt),
			Deliveries: round3(float64(deliv-lastDeliv) / dt)}
		lastSent, lastConf, lastDeliv = sent, conf, deliv
		if r.mix != nil {
			reads := r.mix.readsOK.Load()
			pt.Reads = round3(float64(reads-lastReads) / dt)
			lastReads = reads
		}
		if r.rss != nil {
			pt.ServerRSS, _ = r.rss(context.Background())
		}
		if r.cfg.MetricsURL != "" && r.cfg.Scenario != "idle" {
			ctx, cancel := context.WithTimeout(context.Background(), tick/2)
			if v, err := scrapeMetric(ctx, r.cfg.MetricsURL, "parley_fanout_backlog"); err == nil {
				n := int64(v)
				pt.FanoutBacklog = &n
				r.backlogPeak.Store(max(r.backlogPeak.Load(), n))
				r.backlogSeen.Store(true)
			}
			cancel()
		}
		for _, s := range r.series {
			h := s.h.Interval()
			p := IntervalPct{N: h.TotalCount()}
			if p.N > 0 {
				p.P50 = round3(float64(h.ValueAtQuantile(50)) / 1000)
				p.P99 = round3(float64(h.ValueAtQuantile(99)) / 1000)
				p.Max = round3(float64(h.Max()) / 1000)
			}
			pt.Latency[s.name] = p
		}
		r.tmu.Lock()
		r.timeline = append(r.timeline, pt)
		r.tmu.Unlock()
		if r.cfg.Live == LiveOff {
			return
		}
		line := r.liveLine(pt)
		if r.cfg.Live == LiveTTY {
			fmt.Fprint(r.cfg.Out, "\r"+line+"\x1b[K")
		} else {
			fmt.Fprintln(r.cfg.Out, line)
		}
	}
	for {
		select {
		case <-done:
			sample()
			if r.cfg.Live == LiveTTY {
				fmt.Fprintln(r.cfg.Out)
			}
			return
		case <-t.C:
			sample()
		}
	}
}

// liveLine is the progress line of one interval.
func (r *runner) liveLine(pt TimelinePoint) string {
	if r.line != nil {
		return r.line(pt)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%5.1fs  sent %6.0f/s  confirmed %6.0f/s  delivered %7.0f/s", pt.T, pt.Sends, pt.Confirmed, pt.Deliveries)
	if r.mix != nil {
		fmt.Fprintf(&b, "  reads %6.0f/s", pt.Reads)
	}
	for _, s := range r.series {
		fmt.Fprintf(&b, "  %s p99 %7.2fms", s.name, pt.Latency[s.name].P99)
	}
	fmt.Fprintf(&b, "  inflight %6d  errors %d", r.inflight.Load(), r.errs.Total())
	return b.String()
}

// startSampler starts the sampler from now; the returned function stops
// it (taking a last sample) and waits for it.
func (r *runner) startSampler(tick time.Duration) (start int64, stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	start = r.clk.now()
	r.goroutine(func() { r.sampler(start, tick, done, stopped) })
	var once bool
	return start, func() {
		if once {
			return
		}
		once = true
		close(done)
		<-stopped
	}
}

// curves fills the report's timeline and distribution curves.
func (r *runner) curves() {
	rep := r.report
	r.tmu.Lock()
	rep.Timeline = r.timeline
	r.tmu.Unlock()
	rep.Curves = map[string][]CurvePoint{}
	rep.Latency = map[string]Summary{}
	rep.SeriesNames = nil
	for _, s := range r.series {
		rep.SeriesNames = append(rep.SeriesNames, s.name)
		h := s.h.Total()
		rep.Latency[s.name] = Summarize(h)
		if c := Curve(h); c != nil {
			rep.Curves[s.name] = c
		}
	}
}
