package loadtest

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/parley-im/parley/test/parleytest"
)

// TestMixed runs scenario mixed: 60 users with 1.5 devices each (30 of
// them with two), 3 direct conversations per user and 5 groups of 8,
// random senders, and reads 200 ms (±50 %) after half the pushes. Every
// confirmed send must reach every other member device, the sender's own
// other device included; every read must get its read_ok.
func TestMixed(t *testing.T) {
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	env := parleytest.Start(t, cfg)
	for _, mode := range []ClientMode{ClientPipe, ClientDo} {
		t.Run(string(mode), func(t *testing.T) {
			rep := runScenario(t, env, Config{Scenario: "mixed", Client: mode, Rate: 300, Duration: 1500 * time.Millisecond,
				Users: 60, DevicesPerUser: 1.5, Directs: 3, Groups: 5, Size: 8, ReadProb: 0.5, ReadDelay: 200 * time.Millisecond,
				TypingProb: 0.5, EditProb: 0.1, ClearProb: 0.2, ReceiptsProb: 0.2,
				// The drain ends as soon as every reply and push is in; the
				// full wait is for a machine busy with other test packages.
				Drain: 10 * time.Second})
			checkMixed(t, rep)
			// The message features ran, every one without an error (errors
			// of rid-less requests are counted in rep.Errors), and clears
			// lost no delivery (checkMixed).
			f := rep.Mixed.Features
			if f == nil || f.Typing == 0 || f.TypingIn == 0 || f.Edits == 0 || f.Clears == 0 || f.ReceiptQueries == 0 || f.ReceiptsIn == 0 {
				t.Errorf("features %+v", f)
			}
		})
	}
}

func checkMixed(t *testing.T, rep *Report) {
	t.Helper()
	mr := rep.Mixed
	if mr == nil {
		t.Fatal("no mixed report")
	}
	if mr.Users != 60 || mr.Devices != 90 || mr.MultiDeviceUsers != 30 || rep.Connections != 90 || mr.Directs != 90 || mr.Groups != 5 {
		t.Errorf("users %d devices %d multi %d connections %d directs %d groups %d", mr.Users, mr.Devices, mr.MultiDeviceUsers, rep.Connections, mr.Directs, mr.Groups)
	}
	if rep.Confirmed == 0 || rep.Confirmed != rep.Sent || len(rep.Errors) != 0 {
		t.Errorf("sent %d confirmed %d errors %v", rep.Sent, rep.Confirmed, rep.Errors)
	}
	if rep.Lost != 0 || rep.Duplicated != 0 || rep.Failed() || rep.UnexpectedPushes != 0 {
		t.Errorf("lost %d duplicated %d unexpected %d (sample %v)", rep.Lost, rep.Duplicated, rep.UnexpectedPushes, rep.LostSample)
	}
	// Each send is owed at least one push (a direct partner has a device).
	if rep.Expected < rep.Confirmed || rep.Delivered != rep.Expected {
		t.Errorf("expected %d delivered %d for %d confirmed", rep.Expected, rep.Delivered, rep.Confirmed)
	}
	if mr.DirectSends == 0 || mr.GroupSends == 0 || mr.DirectSends+mr.GroupSends != rep.Sent {
		t.Errorf("direct sends %d group sends %d of %d", mr.DirectSends, mr.GroupSends, rep.Sent)
	}
	// (A device that fell behind gets a hint and syncs instead.)
	if mr.SiblingOwed == 0 || mr.SiblingPushed > mr.SiblingOwed || mr.SiblingPushed+rep.Synced < mr.SiblingOwed {
		t.Errorf("pushes to the sender's other devices %d of %d owed", mr.SiblingPushed, mr.SiblingOwed)
	}
	if rep.SendOKMs.Count != rep.Confirmed || rep.PushMs.Count+rep.Synced != rep.Delivered {
		t.Errorf("histogram counts %d/%d, want %d/%d", rep.SendOKMs.Count, rep.PushMs.Count, rep.Confirmed, rep.Delivered)
	}
	if mr.Reads == 0 || mr.ReadOK != mr.Reads || mr.ReadsScheduled != mr.Reads || mr.ReadsUnsent != 0 || mr.ReadShort != 0 {
		t.Errorf("reads scheduled %d sent %d ok %d unsent %d short %d", mr.ReadsScheduled, mr.Reads, mr.ReadOK, mr.ReadsUnsent, mr.ReadShort)
	}
	// Coalescing: at most one read per push, far fewer at this rate.
	if mr.Reads > rep.Delivered {
		t.Errorf("%d reads for %d deliveries", mr.Reads, rep.Delivered)
	}
	if rep.ReadOKMs == nil || rep.ReadOKMs.Count != mr.ReadOK || rep.ReadOKMs.P50 <= 0 || rep.ReadsPerS == nil || *rep.ReadsPerS <= 0 || rep.Latency["read_ok"].Count != mr.ReadOK {
		t.Errorf("read_ok_ms %+v, reads/s %v", rep.ReadOKMs, rep.ReadsPerS)
	}
	// A read that advanced the position tells the user's other device.
	if mr.ReadChanged == 0 {
		t.Errorf("no read_changed for the users with two devices")
	}
	var reads float64
	for _, pt := range rep.Timeline {
		reads += pt.Reads
	}
	if reads == 0 || len(rep.Curves["read_ok"]) < 5 {
		t.Errorf("timeline reads %v, read_ok curve %d points", reads, len(rep.Curves["read_ok"]))
	}

	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(js.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"send_ok_ms", "push_ms", "read_ok_ms", "reads_per_s", "deliveries_per_s", "mixed", "timeline"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON report lacks %q", k)
		}
	}
	s, _ := m["read_ok_ms"].(map[string]any)
	for _, k := range []string{"p50", "p90", "p99", "p999", "max"} {
		if _, ok := s[k]; !ok {
			t.Errorf("JSON report: read_ok_ms lacks %q", k)
		}
	}
}

func TestDevicesPerUser(t *testing.T) {
	for _, tc := range []struct {
		users int
		d     float64
	}{{1000, 1.6}, {7, 1.6}, {10, 1}, {10, 2}, {33, 2.5}, {5, 8}} {
		devs := devicesPerUser(tc.users, tc.d)
		total := 0
		lo, hi := int32(tc.d), int32(tc.d+0.999999)
		for _, n := range devs {
			total += int(n)
			if n < lo || n > hi {
				t.Errorf("%v: a user with %d devices", tc, n)
			}
		}
		if want := int(float64(tc.users)*tc.d + 0.5); total != want {
			t.Errorf("%v: %d devices, want %d", tc, total, want)
		}
	}
}

func TestDirectPairs(t *testing.T) {
	for _, tc := range []struct{ users, k int }{{60, 3}, {3, 2}, {2, 1}, {1000, 4}, {10, 9}} {
		pairs := directPairs(tc.users, tc.k, rand.New(rand.NewPCG(1, 2)))
		count := make([]int, tc.users)
		seen := map[[2]int32]bool{}
		for _, p := range pairs {
			a, b := min(p[0], p[1]), max(p[0], p[1])
			if a == b || seen[[2]int32{a, b}] {
				t.Fatalf("%v: pair %v repeated or with itself", tc, p)
			}
			seen[[2]int32{a, b}] = true
			count[a]++
			count[b]++
		}
		for u, c := range count {
			if c != tc.k {
				t.Errorf("%v: user %d in %d pairs", tc, u, c)
			}
		}
	}
}

func TestGroupMembers(t *testing.T) {
	groups := groupMembers(20, 30, 20, rand.New(rand.NewPCG(1, 2)))
	for _, g := range groups {
		seen := map[int32]bool{}
		for _, u := range g {
			if seen[u] || u < 0 || u >= 20 {
				t.Fatalf("group %v", g)
			}
			seen[u] = true
		}
		if len(g) != 20 {
			t.Fatalf("group of %d", len(g))
		}
	}
}

func TestValidateMixed(t *testing.T) {
	base := Config{Scenario: "mixed", Addr: "127.0.0.1:7070", AdminURL: "http://127.0.0.1:8081", Rate: 100}
	ok := base
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	if ok.Users != 1000 || ok.DevicesPerUser != 1.6 || ok.Groups != 50 || ok.Size != 20 || ok.Directs != 4 || ok.ReadProb != 0.3 || ok.ReadDelay != time.Second {
		t.Errorf("defaults %+v", ok)
	}
	for name, mod := range map[string]func(*Config){
		"no rate":            func(c *Config) { c.Rate = 0 },
		"one user":           func(c *Config) { c.Users = 1 },
		"devices per user":   func(c *Config) { c.DevicesPerUser = 0.5 },
		"too many devices":   func(c *Config) { c.Users, c.DevicesPerUser = MaxConns, 2 },
		"directs":            func(c *Config) { c.Users, c.Directs = 10, 10 },
		"odd directs":        func(c *Config) { c.Users, c.Directs = 11, 3 },
		"no conversations":   func(c *Config) { c.Directs, c.Groups = -1, -1 },
		"group above users":  func(c *Config) { c.Users, c.Size = 10, 11 },
		"read prob":          func(c *Config) { c.ReadProb = 1.5 },
		"read delay":         func(c *Config) { c.ReadDelay = time.Hour },
		"negative groups":    func(c *Config) { c.Scenario = "group"; c.Groups = -1 },
		"remote":             func(c *Config) { c.Addr = "10.0.0.1:7070" },
		"groups × size":      func(c *Config) { c.Groups, c.Size = MaxConns, 2 },
		"devices per user 9": func(c *Config) { c.DevicesPerUser = 9 },
	} {
		c := base
		mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c := base
	c.Directs, c.ReadProb, c.ReadDelay = -1, -1, -1 // groups only, no reads
	if err := c.Validate(); err != nil {
		t.Errorf("groups only: %v", err)
	}
}
