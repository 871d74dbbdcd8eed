package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/test/parleytest"
)

// TestDirect runs scenario direct against a real in-process server and
// checks that nothing confirmed was lost or duplicated and that the JSON
// report has every key the issue asks for.
func TestDirect(t *testing.T) {
	cfg := parleytest.Config(t)
	cfg.SendRate = 0 // no per-device rate limit
	env := parleytest.Start(t, cfg)

	for _, mode := range []ClientMode{ClientPipe, ClientDo} {
		t.Run(string(mode), func(t *testing.T) { runDirectTest(t, env, mode, 0, 0) })
	}
	// With a warm-up the report is of the window alone: its 1,000 sends,
	// and latencies of those only.
	t.Run("warmup", func(t *testing.T) {
		rep := runDirectTest(t, env, ClientPipe, 0, time.Second)
		if rep.Sent != 1000 {
			t.Errorf("sent %d in the window, want 1000", rep.Sent)
		}
	})
}

// TestDirectHints loses every 10th push on the client side: the device's
// cursor stops below the gap, so its acks do not cover what was pushed,
// the server's redelivery scan (after 200 ms here) sends a hint, and the
// tool must sync as a client does, so nothing counts as lost.
func TestDirectHints(t *testing.T) {
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	cfg.RedeliveryDelay = 200 * time.Millisecond
	env := parleytest.Start(t, cfg)
	rep := runDirectTest(t, env, ClientPipe, 10, 0)
	if rep.Hints == 0 || rep.Syncs == 0 || rep.Synced == 0 {
		t.Errorf("hints %d, sync pages %d, deliveries by sync %d", rep.Hints, rep.Syncs, rep.Synced)
	}
}

func runDirectTest(t *testing.T, env *parleytest.Env, mode ClientMode, dropEvery int64, warmup time.Duration) *Report {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := Run(ctx, Config{
		Scenario:   "direct",
		Addr:       env.Addr,
		AdminURL:   env.AdminURL,
		AdminToken: parleytest.AdminToken,
		Rate:       500,
		Duration:   2 * time.Second,
		Warmup:     warmup,
		Pairs:      20,
		Out:        &out,
		Live:       LiveLines,
		Client:     mode,
		dropEvery:  dropEvery,
	})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	var table bytes.Buffer
	rep.WriteTable(&table)
	t.Logf("\n%s%s", out.String(), table.String())

	if rep.Confirmed == 0 {
		t.Errorf("confirmed = 0")
	}
	if rep.Lost != 0 || rep.Duplicated != 0 || rep.Failed() {
		t.Errorf("lost %d, duplicated %d (sample %v)", rep.Lost, rep.Duplicated, rep.LostSample)
	}
	if rep.Confirmed != rep.Sent || rep.Delivered != rep.Confirmed || len(rep.Errors) != 0 {
		t.Errorf("sent %d confirmed %d delivered %d errors %v", rep.Sent, rep.Confirmed, rep.Delivered, rep.Errors)
	}
	if rep.Acks == 0 {
		t.Errorf("no acks")
	}
	if rep.SendOKMs.Count != rep.Confirmed || rep.PushMs.Count+rep.Synced != rep.Delivered {
		t.Errorf("histogram counts %d/%d, want %d/%d", rep.SendOKMs.Count, rep.PushMs.Count, rep.Confirmed, rep.Delivered)
	}
	if !strings.Contains(out.String(), "sent") {
		t.Errorf("no live line in %q", out.String())
	}

	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(js.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"scenario", "duration_s", "target_rate", "sends_per_s", "deliveries_per_s",
		"sent", "confirmed", "delivered", "lost", "duplicated", "errors", "send_ok_ms", "push_ms", "server_cpu_us_per_send"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON report lacks %q", k)
		}
	}
	for _, h := range []string{"send_ok_ms", "push_ms"} {
		s, _ := m[h].(map[string]any)
		for _, k := range []string{"p50", "p90", "p99", "p999", "max"} {
			if _, ok := s[k]; !ok {
				t.Errorf("JSON report: %s lacks %q", h, k)
			}
		}
	}
	if m["scenario"] != "direct" {
		t.Errorf("scenario = %v", m["scenario"])
	}
	return rep
}

func TestTracker(t *testing.T) {
	tr := NewTracker()
	c := tr.Track("c1", 1, "a", "b")
	a, b := c.member("a"), c.member("b")
	tr.Confirmed(c, a, 2, false)
	tr.Confirmed(c, a, 3, false)
	tr.Confirmed(c, b, 4, false)
	tr.Confirmed(c, a, 2, true) // dup reply: counted apart
	tr.Pushed(c, b, 2)
	tr.Pushed(c, b, 2) // duplicate
	tr.Pushed(c, a, 4)
	tr.Pushed(c, b, 5) // pushed, never confirmed (a reply that was late)
	tr.Pushed(c, a, 3) // a's own send pushed back to a
	tr.Confirmed(c, a, 130, false)
	tr.Pushed(c, b, 130) // beyond one word
	tr.Confirmed(c, a, 140, false)
	tr.Synced(c, b, 140, false) // a hint made b sync it
	tr.Synced(c, a, 140, true)  // a's own send, read back by a sync
	if tr.Pushed(c, b, 140) {   // a late push after the sync: no new delivery, no duplicate
		t.Errorf("a push after a sync counted as a delivery")
	}
	lost, n, unconf := tr.Check(10)
	if n != 1 || len(lost) != 1 || lost[0] != (Lost{Conv: "c1", Device: "b", Seq: 3}) {
		t.Errorf("lost %d %v", n, lost)
	}
	if unconf != 1 {
		t.Errorf("unconfirmed %d", unconf)
	}
	if tr.duplicated.Load() != 1 || tr.dupReplies.Load() != 1 || tr.unexpected.Load() != 1 {
		t.Errorf("dup %d dupReplies %d unexpected %d", tr.duplicated.Load(), tr.dupReplies.Load(), tr.unexpected.Load())
	}
	if tr.synced.Load() != 1 {
		t.Errorf("synced %d", tr.synced.Load())
	}
	if c.cursorOf(a) != 4 || c.cursorOf(b) != 2 {
		t.Errorf("cursors %d %d", c.cursorOf(a), c.cursorOf(b))
	}
	if tr.confirmed.Load() != 5 || tr.expected.Load() != 5 || tr.delivered.Load() != 5 {
		t.Errorf("confirmed %d expected %d delivered %d", tr.confirmed.Load(), tr.expected.Load(), tr.delivered.Load())
	}
}

// Non-msg events a device holds (an update, a leave) move its cursor
// like its messages, and are neither owed nor lost nor deliveries.
func TestTrackerHeld(t *testing.T) {
	tr := NewTracker()
	c := tr.Track("c1", 1, "a", "b")
	a, b := c.member("a"), c.member("b")
	tr.Confirmed(c, a, 2, false)
	tr.Held(c, b, 3) // an update pushed to b
	tr.Held(c, a, 3) // a made it: its reply told the seq
	tr.Confirmed(c, a, 4, false)
	tr.Pushed(c, b, 4)
	if c.cursorOf(b) != 1 {
		t.Errorf("b's cursor %d, want 1: seq 2 is still missing", c.cursorOf(b))
	}
	tr.Pushed(c, b, 2)
	if c.cursorOf(a) != 4 || c.cursorOf(b) != 4 {
		t.Errorf("cursors %d %d, want 4 4", c.cursorOf(a), c.cursorOf(b))
	}
	if seq, ok := c.ackable(b); !ok || seq != 4 {
		t.Errorf("ackable %d %v, want 4", seq, ok)
	}
	if _, n, unconf := tr.Check(10); n != 0 || unconf != 0 {
		t.Errorf("lost %d unconfirmed %d", n, unconf)
	}
	if tr.expected.Load() != 2 || tr.delivered.Load() != 2 {
		t.Errorf("expected %d delivered %d, want 2 2", tr.expected.Load(), tr.delivered.Load())
	}
}

func TestValidate(t *testing.T) {
	base := Config{Scenario: "direct", Addr: "127.0.0.1:7070", AdminURL: "http://127.0.0.1:8081", Rate: 100}
	ok := base
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Config){
		"remote addr":      func(c *Config) { c.Addr = "10.1.2.3:7070" },
		"remote admin":     func(c *Config) { c.AdminURL = "http://example.com:8081" },
		"too long":         func(c *Config) { c.Duration = time.Hour },
		"no rate":          func(c *Config) { c.Rate = 0 },
		"tiny body":        func(c *Config) { c.BodySize = 4 },
		"unknown scenario": func(c *Config) { c.Scenario = "nope" },
		"long warmup":      func(c *Config) { c.Warmup = 2 * time.Minute },
		"idle warmup":      func(c *Config) { c.Scenario, c.Warmup = "idle", time.Second },
		"direct moderated": func(c *Config) { c.Moderate = 1 },
		"moderate < 0":     func(c *Config) { c.Scenario, c.Moderate = "large", -1 },
		"nobody offline":   func(c *Config) { c.Scenario, c.Members, c.Online, c.Moderate = "large", 100, 99, 1 },
	} {
		c := base
		mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c := base
	c.Scenario, c.Members, c.Online, c.Moderate = "large", 100, 98, 0.5
	if err := c.Validate(); err != nil {
		t.Errorf("large with a moderator and 2 offline members: %v", err)
	}
	c = base
	c.Addr, c.AllowRemote = "10.1.2.3:7070", true
	if err := c.Validate(); err != nil {
		t.Errorf("remote with AllowRemote: %v", err)
	}
}
