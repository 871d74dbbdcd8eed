package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parley-im/parley/test/parleytest"
)

// TestProbes: a direct run with both probes reports each probe's
// latency over the window and per second of the timeline, and the WAL
// written per confirmed send; the text and JSON reports carry them.
func TestProbes(t *testing.T) {
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	env := parleytest.Start(t, cfg)
	// The postmaster: the parent of a backend.
	c, err := pgx.Connect(context.Background(), cfg.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	backend := int(c.PgConn().PID())
	postmaster, _, err := procStat(backend)
	c.Close(context.Background())
	if err != nil {
		t.Skipf("no process accounting here: %v", err)
	}
	rep := runScenario(t, env, Config{Scenario: "direct", Rate: 500, Duration: 2 * time.Second, Pairs: 10,
		ProbePostgres: cfg.PostgresURL, ProbeRedis: cfg.RedisURL, ProbeRate: 100,
		CPUPIDs: map[string]int{"postgres": postmaster}})
	// The commit probe's backends are shown apart from the server's
	// PostgreSQL.
	var names []string
	for _, u := range rep.CPU {
		names = append(names, u.Name)
	}
	if !slices.Contains(names, "postgres") || !slices.Contains(names, probeCPUName) {
		t.Errorf("CPU entries %v: want postgres and %s", names, probeCPUName)
	}
	for _, name := range []string{"pg_commit", "redis_ping"} {
		s, ok := rep.Latency[name]
		// About 200 probes in the window; allow for a slow machine.
		if !ok || s.Count < 50 || s.P50 <= 0 || s.P99 < s.P50 {
			t.Errorf("%s over the window: %+v (present %v)", name, s, ok)
		}
		seconds := 0
		for _, pt := range rep.Timeline {
			if pt.Latency[name].N > 0 {
				seconds++
			}
		}
		if seconds < 2 {
			t.Errorf("%s in %d seconds of the timeline", name, seconds)
		}
	}
	w := rep.WAL
	if w == nil || w.Bytes <= 0 || w.Records <= 0 || w.BytesPerSend == nil || *w.BytesPerSend <= 0 {
		t.Fatalf("wal %+v", w)
	}
	var table, js bytes.Buffer
	rep.WriteTable(&table)
	for _, part := range []string{"pg_commit_ms", "redis_ping_ms", "records per send"} {
		if !strings.Contains(table.String(), part) {
			t.Errorf("table lacks %q", part)
		}
	}
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var m struct {
		WAL     map[string]any            `json:"wal"`
		Latency map[string]map[string]any `json:"latency_ms"`
	}
	if err := json.Unmarshal(js.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if m.WAL["bytes_per_send"] == nil || m.Latency["pg_commit"]["p99"] == nil || m.Latency["redis_ping"]["p99"] == nil {
		t.Errorf("JSON report: wal %v, latency %v", m.WAL, m.Latency)
	}
}

// TestMixedWarmup: mixed with a warm-up reports the window alone.
func TestMixedWarmup(t *testing.T) {
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	env := parleytest.Start(t, cfg)
	rep := runScenario(t, env, Config{Scenario: "mixed", Rate: 300, Duration: 1500 * time.Millisecond, Warmup: time.Second,
		Users: 60, DevicesPerUser: 1.5, Directs: 3, Groups: 5, Size: 8, ReadProb: 0.5, ReadDelay: 200 * time.Millisecond})
	mr := rep.Mixed
	if rep.Sent != 450 || rep.Confirmed != 450 || mr.DirectSends+mr.GroupSends != 450 || len(rep.Errors) != 0 {
		t.Errorf("window: sent %d confirmed %d (direct %d, group %d), errors %v; want 450", rep.Sent, rep.Confirmed, mr.DirectSends, mr.GroupSends, rep.Errors)
	}
	// Lost and duplicated count the warm-up too; nothing of either.
	if rep.Lost != 0 || rep.Duplicated != 0 || rep.Failed() {
		t.Errorf("lost %d duplicated %d", rep.Lost, rep.Duplicated)
	}
	if rep.SendOKMs.Count != rep.Confirmed || mr.Reads == 0 || mr.ReadOK != mr.Reads || rep.ReadOKMs == nil || rep.ReadOKMs.Count != mr.ReadOK {
		t.Errorf("window histograms: send_ok %d for %d confirmed; reads %d, read_ok %d, read_ok_ms %+v", rep.SendOKMs.Count, rep.Confirmed, mr.Reads, mr.ReadOK, rep.ReadOKMs)
	}
}
