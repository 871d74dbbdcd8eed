package loadtest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// runDirect is scenario direct: Pairs pairs of users, one device each, a
// direct conversation per pair. Both users of a pair send to each other;
// send k goes out from device k mod 2·Pairs, so the aggregate is
// cfg.Rate and every device sends at cfg.Rate / (2·Pairs). Every
// confirmed send is owed exactly one push, to the partner's device.
//
// With Phones every user also has a phone that is registered for
// notifications and never connects, so each message is notified to the
// receiver's phone (collapsed per notify_delay); the connected devices
// are registered too, and ack in time. The sink's count is reported;
// what is measured is the send path beside that work.
func runDirect(ctx context.Context, r *runner) error {
	if err := r.checkFDs(); err != nil {
		return err
	}
	p := r.cfg.Pairs
	n := 2 * p
	t0 := time.Now()
	users := make([]string, n)
	devs := make([]Device, n)
	for i := range users {
		users[i] = r.cfg.Prefix + "u" + strconv.Itoa(i)
		devs[i] = Device{ID: r.cfg.Prefix + "d" + strconv.Itoa(i), User: users[i]}
	}
	if r.cfg.Phones {
		for i := range users {
			devs = append(devs, Device{ID: r.cfg.Prefix + "p" + strconv.Itoa(i), User: users[i]})
		}
	}
	if err := r.admin.Users(ctx, users); err != nil {
		return fmt.Errorf("provisioning users: %w", err)
	}
	devs, err := r.admin.Devices(ctx, devs)
	if err != nil {
		return fmt.Errorf("provisioning devices: %w", err)
	}
	var sink *notifySink
	if r.cfg.Phones {
		var closeSink func()
		if sink, closeSink, err = r.startSink(); err != nil {
			return err
		}
		defer closeSink()
		t0 := time.Now()
		if err := r.registerReceivers(ctx, devs, func(int) []string { return nil }); err != nil {
			return err
		}
		fmt.Fprintf(r.cfg.Out, "registered %d devices (%d phones, never connected) in %s\n", len(devs), n, time.Since(t0).Round(time.Millisecond))
		devs = devs[:n]
	}
	specs := make([]ConvSpec, p)
	for i := range specs {
		specs[i] = ConvSpec{Kind: "direct", Members: []string{users[2*i], users[2*i+1]}}
	}
	convs, err := r.admin.Conversations(ctx, specs)
	if err != nil {
		return fmt.Errorf("provisioning conversations: %w", err)
	}
	convOf := make([]string, n) // device index → its conversation
	tracks := make([]*convTrack, n)
	for i, c := range convs {
		tr := r.tracker.Track(c.ID, c.Head, devs[2*i].ID, devs[2*i+1].ID)
		convOf[2*i], convOf[2*i+1] = c.ID, c.ID
		tracks[2*i], tracks[2*i+1] = tr, tr
	}
	fmt.Fprintf(r.cfg.Out, "provisioned %d users, %d devices, %d direct conversations in %s (prefix %s)\n",
		n, n, p, time.Since(t0).Round(time.Millisecond), r.cfg.Prefix)

	t0 = time.Now()
	conns, err := r.connectAll(ctx, devs, func(i int) []*convTrack { return tracks[i : i+1] })
	if err != nil {
		return err
	}
	fmt.Fprintf(r.cfg.Out, "connected %d devices in %s\n", n, time.Since(t0).Round(time.Millisecond))
	r.report.Pairs = p
	r.report.Connections = n

	r.load(ctx, func(k, intended int64) {
		i := int(k % int64(n))
		conns[i].send(convOf[i], k, intended)
	})
	if sink != nil {
		// The connected devices ack the last pushes as a client does;
		// the phones' notifications of the last sends are due
		// notify_delay after their commits.
		r.keepAcking(conns)
		select {
		case <-time.After(r.cfg.NotifyDelay + time.Second):
		case <-ctx.Done():
		}
		phone := r.cfg.Prefix + "p" // only phones are owed notifications
		r.report.Notify = sink.report(func(key string) bool { return strings.HasPrefix(key, phone) })
	}
	return nil
}
