package loadtest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/parley-im/parley/wire"
)

// TypingReport is scenario typing's part of the report: typing frames
// written and the relayed ones received, and the server's CPU per frame
// of each.
type TypingReport struct {
	Devices       int      `json:"devices"`
	Groups        int      `json:"groups"`
	GroupSize     int      `json:"group_size"`
	GroupsPerDev  int      `json:"groups_per_device"`
	Written       int64    `json:"written"`               // typing frames the devices wrote (after any warm-up)
	Received      int64    `json:"received"`              // typing frames the devices were relayed (after any warm-up)
	WrittenPerS   float64  `json:"written_per_s"`         // over the window
	ReceivedPerS  float64  `json:"received_per_s"`        // over the window
	ServerUsPerIn *float64 `json:"server_us_per_written"` // server CPU per frame written (null without -server-pid)
	ServerUsPerTo *float64 `json:"server_us_per_received"`
	// From a device's typing frame to its relay's arrival at another
	// member's device (the server may hold it up to relay_coalesce).
	RelayMs Summary `json:"relay_ms"`
}

// runTyping is scenario typing: Devices devices (one user each), all
// connected, in Groups push-tier groups of Size members (group i's
// members are devices i·Size … i·Size + Size − 1, modulo Devices, so each
// device is in Groups·Size / Devices groups). Nothing is sent: frame k is
// a typing frame (without rid) from device k mod Devices in the next of
// its groups in turn, so a device types in each of its groups at Rate ·
// Size / (Groups · Size) per second; keep that under one per 2 s (the
// server relays at most one per device and conversation per 2 s). The
// server relays each to the group's other online devices: received is
// about written × (Size − 1). The report's CPU figures are per frame
// written and per frame received.
func runTyping(ctx context.Context, r *runner) error {
	if err := r.checkFDs(); err != nil {
		return err
	}
	n, g, s := r.cfg.Devices, r.cfg.Groups, r.cfg.Size
	t0 := time.Now()
	users, devs, err := r.provisionUsers(ctx, n, n)
	if err != nil {
		return err
	}
	specs := make([]ConvSpec, g)
	groupsOf := make([][]string, n) // device index → its groups
	for i := range specs {
		members := make([]string, 0, s)
		for j := 0; j < s; j++ {
			d := (i*s + j) % n
			members = append(members, users[d])
		}
		// A group smaller than Size when Devices < Size: each member once.
		slices.Sort(members)
		specs[i] = ConvSpec{ID: r.cfg.Prefix + "t" + strconv.Itoa(i), Kind: "group", Members: slices.Compact(members)}
	}
	convs, err := r.admin.Conversations(ctx, specs)
	if err != nil {
		return fmt.Errorf("provisioning conversations: %w", err)
	}
	for i, c := range convs {
		for j := 0; j < s; j++ {
			d := (i*s + j) % n
			groupsOf[d] = append(groupsOf[d], c.ID)
		}
	}
	fmt.Fprintf(r.cfg.Out, "provisioned %d users and devices, %d groups of %d in %s (prefix %s)\n",
		n, g, s, time.Since(t0).Round(time.Millisecond), r.cfg.Prefix)
	t0 = time.Now()
	conns, err := r.connectAll(ctx, devs, func(int) []*convTrack { return nil })
	if err != nil {
		return err
	}
	fmt.Fprintf(r.cfg.Out, "connected %d devices in %s\n", n, time.Since(t0).Round(time.Millisecond))
	r.report.Connections = n
	f := &featureMix{relay: NewHist()}
	r.features = f
	r.series = []series{{"typing", f.relay}}
	r.line = func(pt TimelinePoint) string {
		return fmt.Sprintf("%5.1fs  typing written %7d  received %8d  relay p50 %7.2fms  p99 %7.2fms  errors %d",
			pt.T, f.typing.Load(), f.typingIn.Load(), pt.Latency["typing"].P50, pt.Latency["typing"].P99, r.errs.Total())
	}
	next := make([]int, n) // only fire uses it, on the pacer's goroutine
	r.load(ctx, func(k, _ int64) {
		d := int(k % int64(n))
		gs := groupsOf[d]
		if len(gs) == 0 {
			return
		}
		conv := gs[next[d]%len(gs)]
		next[d]++
		f.typing.Add(1)
		f.typed(conv, users[d], r.clk.now())
		conns[d].fireAndForget(wire.Request{T: wire.TTyping, Conv: conv})
	})
	rep := r.report
	tr := &TypingReport{Devices: n, Groups: g, GroupSize: s, GroupsPerDev: g * s / n,
		Written: f.typing.Load() - r.warm.typing, Received: f.typingIn.Load() - r.warm.typingIn,
		RelayMs: Summarize(f.relay.Total())}
	if rep.DurationS > 0 {
		tr.WrittenPerS = round3(float64(tr.Written) / rep.DurationS)
		tr.ReceivedPerS = round3(float64(tr.Received) / rep.DurationS)
	}
	for _, c := range rep.CPU {
		if c.Name != "server" {
			continue
		}
		if tr.Written > 0 {
			v := round3(c.CPUSeconds * 1e6 / float64(tr.Written))
			tr.ServerUsPerIn = &v
		}
		if tr.Received > 0 {
			v := round3(c.CPUSeconds * 1e6 / float64(tr.Received))
			tr.ServerUsPerTo = &v
		}
	}
	rep.Typing = tr
	return nil
}
