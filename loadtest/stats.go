package loadtest

import (
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Histograms record microseconds from 1 µs to histMax with 3 significant
// digits; larger values are clamped to histMax.
const (
	histMaxUs  = int64(10 * time.Minute / time.Microsecond)
	histSigFig = 3
	histShards = 8
)

// Hist is a latency histogram that many goroutines record into: one HDR
// histogram per shard (a recorder picks its shard, e.g. by connection
// index), each shard with a running total and an interval histogram the
// live line drains once a second.
type Hist struct {
	shards [histShards]histShard
}

type histShard struct {
	mu       sync.Mutex // guards total and interval
	total    *hdrhistogram.Histogram
	interval *hdrhistogram.Histogram
	_        [40]byte // keep shards on separate cache lines
}

// NewHist returns an empty histogram.
func NewHist() *Hist {
	h := &Hist{}
	for i := range h.shards {
		h.shards[i].total = hdrhistogram.New(1, histMaxUs, histSigFig)
		h.shards[i].interval = hdrhistogram.New(1, histMaxUs, histSigFig)
	}
	return h
}

// Record adds one observation of d nanoseconds to shard (any int; taken
// modulo the shard count). Negative values count as 0.
func (h *Hist) Record(shard int, d int64) {
	us := d / int64(time.Microsecond)
	us = min(max(us, 1), histMaxUs)
	s := &h.shards[uint(shard)%histShards]
	s.mu.Lock()
	_ = s.total.RecordValue(us)
	_ = s.interval.RecordValue(us)
	s.mu.Unlock()
}

// Reset forgets everything recorded.
func (h *Hist) Reset() {
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		s.total.Reset()
		s.interval.Reset()
		s.mu.Unlock()
	}
}

// Interval merges and resets the interval histograms: what was recorded
// since the previous call.
func (h *Hist) Interval() *hdrhistogram.Histogram {
	out := hdrhistogram.New(1, histMaxUs, histSigFig)
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		out.Merge(s.interval)
		s.interval.Reset()
		s.mu.Unlock()
	}
	return out
}

// Total merges the running totals.
func (h *Hist) Total() *hdrhistogram.Histogram {
	out := hdrhistogram.New(1, histMaxUs, histSigFig)
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		out.Merge(s.total)
		s.mu.Unlock()
	}
	return out
}

// Summary is the percentiles of one latency metric, in milliseconds.
type Summary struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p999"`
	Max   float64 `json:"max"`
	Mean  float64 `json:"mean"`
}

// Summarize reads the percentiles of an HDR histogram of microseconds.
func Summarize(h *hdrhistogram.Histogram) Summary {
	if h.TotalCount() == 0 {
		return Summary{}
	}
	ms := func(us int64) float64 { return round3(float64(us) / 1000) }
	return Summary{
		Count: h.TotalCount(),
		P50:   ms(h.ValueAtQuantile(50)),
		P90:   ms(h.ValueAtQuantile(90)),
		P99:   ms(h.ValueAtQuantile(99)),
		P999:  ms(h.ValueAtQuantile(99.9)),
		Max:   ms(h.Max()),
		Mean:  round3(h.Mean() / 1000),
	}
}

func round3(x float64) float64 {
	if x < 0 {
		return -round3(-x)
	}
	return float64(int64(x*1000+0.5)) / 1000
}

// Errors counts errors by code: the protocol's error codes (docs/protocol.md
// §6) and the load tool's own (NO_REPLY, CONN_CLOSED, CLIENT_BACKLOG, …).
type Errors struct {
	mu sync.Mutex
	m  map[string]int64
}

// Add counts n errors of code.
func (e *Errors) Add(code string, n int64) {
	if n == 0 {
		return
	}
	e.mu.Lock()
	if e.m == nil {
		e.m = map[string]int64{}
	}
	e.m[code] += n
	e.mu.Unlock()
}

// Snapshot copies the counts.
func (e *Errors) Snapshot() map[string]int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]int64, len(e.m))
	for k, v := range e.m {
		out[k] = v
	}
	return out
}

// Total is the sum of all counts.
func (e *Errors) Total() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	var n int64
	for _, v := range e.m {
		n += v
	}
	return n
}
