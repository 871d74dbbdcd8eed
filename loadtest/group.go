package loadtest

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// provisionUsers creates n users (prefix + "u" + i) and, for the first
// withDevice of them, one device each (prefix + "d" + i), and returns the
// user ids and the devices with their tokens.
func (r *runner) provisionUsers(ctx context.Context, n, withDevice int) ([]string, []Device, error) {
	users := make([]string, n)
	for i := range users {
		users[i] = r.cfg.Prefix + "u" + strconv.Itoa(i)
	}
	devs := make([]Device, withDevice)
	for i := range devs {
		devs[i] = Device{ID: r.cfg.Prefix + "d" + strconv.Itoa(i), User: users[i]}
	}
	if err := r.admin.Users(ctx, users); err != nil {
		return nil, nil, fmt.Errorf("provisioning users: %w", err)
	}
	if withDevice == 0 {
		return users, nil, nil
	}
	devs, err := r.admin.Devices(ctx, devs)
	if err != nil {
		return nil, nil, fmt.Errorf("provisioning devices: %w", err)
	}
	return users, devs, nil
}

// deviceIDs lists the ids of devs.
func deviceIDs(devs []Device) []string {
	ids := make([]string, len(devs))
	for i, d := range devs {
		ids[i] = d.ID
	}
	return ids
}

// runGroup is scenario group: Groups groups of Size members (push-tier
// groups when Size < write_fanout_max); GroupOnline members of each
// (default all) have one device each and are connected, the others are
// offline members. Send k goes out from member (k / Groups) mod Size of
// group k mod Groups, so consecutive sends go to different groups and
// every device sends at Rate / (Groups · Size). Each confirmed send is
// owed one push to every other member device of its group.
func runGroup(ctx context.Context, r *runner) error {
	if err := r.checkFDs(); err != nil {
		return err
	}
	g, s := r.cfg.Groups, r.cfg.Size
	o := r.cfg.GroupOnline // members of each group with a device
	if o == 0 {
		o = s
	}
	n := g * s
	t0 := time.Now()
	users, _, err := r.provisionUsers(ctx, n, 0)
	if err != nil {
		return err
	}
	var devs []Device
	for i := 0; i < g; i++ {
		for j := 0; j < o; j++ {
			u := i*s + j
			devs = append(devs, Device{ID: r.cfg.Prefix + "d" + strconv.Itoa(u), User: users[u]})
		}
	}
	if devs, err = r.admin.Devices(ctx, devs); err != nil {
		return fmt.Errorf("provisioning devices: %w", err)
	}
	specs := make([]ConvSpec, g)
	for i := range specs {
		specs[i] = ConvSpec{ID: r.cfg.Prefix + "g" + strconv.Itoa(i), Kind: "group", Members: users[i*s : (i+1)*s]}
	}
	convs, err := r.admin.Conversations(ctx, specs)
	if err != nil {
		return fmt.Errorf("provisioning conversations: %w", err)
	}
	tracks := make([]*convTrack, g)
	for i, c := range convs {
		tracks[i] = r.tracker.Track(c.ID, c.Head, deviceIDs(devs[i*o:(i+1)*o])...)
	}
	fmt.Fprintf(r.cfg.Out, "provisioned %d users, %d devices, %d groups of %d (%d online each) in %s (prefix %s)\n",
		n, len(devs), g, s, o, time.Since(t0).Round(time.Millisecond), r.cfg.Prefix)

	t0 = time.Now()
	conns, err := r.connectAll(ctx, devs, func(i int) []*convTrack { return tracks[i/o : i/o+1] })
	if err != nil {
		return err
	}
	fmt.Fprintf(r.cfg.Out, "connected %d devices in %s\n", len(devs), time.Since(t0).Round(time.Millisecond))
	r.report.Groups, r.report.GroupSize, r.report.Connections = g, s, len(devs)

	r.load(ctx, func(k, intended int64) {
		grp := int(k % int64(g))
		m := int((k / int64(g)) % int64(o))
		conns[grp*o+m].send(tracks[grp].id, k, intended)
	})
	return nil
}

// runLarge is scenario large: one group of Members members (provisioned
// with one bulk conversation call), of which the first Online have a
// device and are connected; Senders of those send, send k from sender
// k mod Senders (spread evenly over the online members). Each confirmed
// send is owed Online − 1 pushes: deliveries/s is the headline.
func runLarge(ctx context.Context, r *runner) error {
	if err := r.checkFDs(); err != nil {
		return err
	}
	n, m, k := r.cfg.Members, r.cfg.Online, r.cfg.Senders
	t0 := time.Now()
	users, devs, err := r.provisionUsers(ctx, n, m)
	if err != nil {
		return err
	}
	convs, err := r.admin.Conversations(ctx, []ConvSpec{{ID: r.cfg.Prefix + "large", Kind: "group", Members: users}})
	if err != nil {
		return fmt.Errorf("provisioning the group: %w", err)
	}
	head := convs[0].Head
	// The moderator: the last online member that does not send (the
	// senders are spread evenly from the first), or the last one if all
	// send. A group made through the admin API has no owner: make it one.
	mod := m - 1
	if r.cfg.Moderate > 0 {
		sending := map[int]bool{}
		for i := range k {
			sending[i*m/k] = true
		}
		for i := m - 1; i >= 0; i-- {
			if !sending[i] {
				mod = i
				break
			}
		}
		if head, err = r.admin.SetRole(ctx, convs[0].ID, users[mod], "owner"); err != nil {
			return fmt.Errorf("making the moderator the group's owner: %w", err)
		}
	}
	tr := r.tracker.Track(convs[0].ID, head, deviceIDs(devs)...)
	fmt.Fprintf(r.cfg.Out, "provisioned %d users, %d devices, one group of %d in %s (prefix %s)\n",
		n, m, n, time.Since(t0).Round(time.Millisecond), r.cfg.Prefix)

	t0 = time.Now()
	conns, err := r.connectAll(ctx, devs, func(int) []*convTrack { return []*convTrack{tr} })
	if err != nil {
		return err
	}
	fmt.Fprintf(r.cfg.Out, "connected %d devices in %s\n", m, time.Since(t0).Round(time.Millisecond))
	r.report.Members, r.report.Online, r.report.Senders, r.report.Connections = n, m, k, m

	senders := make([]*Conn, k)
	for i := range senders {
		senders[i] = conns[i*m/k]
	}
	if r.cfg.Moderate > 0 {
		r.moderator = r.newModerator(conns[mod], tr.id, users[m:])
		r.series = []series{{"send_ok", r.sendOK}, {"push", r.push},
			{"update_ok", r.moderator.updateOK}, {"members_ok", r.moderator.membersOK}}
	}
	r.load(ctx, func(j, intended int64) {
		senders[j%int64(k)].send(tr.id, j, intended)
	})
	return nil
}
