// Package fanout delivers committed events to the online devices of the
// members who may see them. For each batch of events it asks the store
// who was a member at each event's seq (G1), looks their devices up in
// the routing table, encodes each push frame once, and hands the frames
// to the gateways holding those devices: directly to this process's
// gateway, through Redis pub/sub (package-level Bus) to the others.
//
// Pushes are hints with payload: a push that is lost (a gateway died, a
// device was too slow) is repaired by the client's sync. Fan-out never
// rolls back or delays a commit.
package fanout

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/route"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/wire"
)

// Target is one device a frame goes to.
type Target struct {
	Device string `msgpack:"d"`
	Token  int64  `msgpack:"k"` // the connection's fencing token
}

// Delivery is one event's push frame for devices on one gateway.
type Delivery struct {
	Conv    string   `msgpack:"c"`
	Seq     int64    `msgpack:"s"`
	Frame   []byte   `msgpack:"f"` // the encoded push (length prefix included), shared by all targets
	Targets []Target `msgpack:"t"`
}

// Local is the gateway of this process: it writes frames to its own
// connections.
type Local interface {
	Deliver(ds []Delivery)
}

// Fanout runs the delivery workers.
type Fanout struct {
	// Static after construction.
	st     *store.Store
	routes *route.Table
	bus    *Bus
	local  Local
	log    *slog.Logger

	queue chan []eventlog.Committed
	wg    sync.WaitGroup

	// Conversations with commits whose dense_seq watermark has not been
	// advanced yet; advanceLoop does it once a second (a lagging
	// watermark only makes unread counting read a few more index entries).
	dmu   sync.Mutex
	dirty map[string]bool
	stop  chan struct{}

	closeOnce sync.Once
}

// New starts workers delivery goroutines.
func New(st *store.Store, routes *route.Table, bus *Bus, local Local, log *slog.Logger, workers int) *Fanout {
	f := &Fanout{st: st, routes: routes, bus: bus, local: local, log: log, queue: make(chan []eventlog.Committed, 4096),
		dirty: map[string]bool{}, stop: make(chan struct{})}
	f.wg.Add(workers)
	for i := 0; i < workers; i++ {
		go f.work()
	}
	f.wg.Add(1)
	go f.advanceLoop()
	return f
}

// Enqueue queues committed events for delivery. It blocks while the queue
// is full, which slows committers down rather than losing pushes.
func (f *Fanout) Enqueue(evs []eventlog.Committed) { f.queue <- evs }

// Close delivers what is queued and stops the workers.
func (f *Fanout) Close() {
	f.closeOnce.Do(func() {
		close(f.queue)
		close(f.stop)
	})
	f.wg.Wait()
}

func (f *Fanout) markDirty(evs []eventlog.Committed) {
	f.dmu.Lock()
	for _, e := range evs {
		f.dirty[e.Conv] = true
	}
	f.dmu.Unlock()
}

func (f *Fanout) advanceLoop() {
	defer f.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			f.advance()
			return
		case <-t.C:
			f.advance()
		}
	}
}

// advance raises the dense_seq watermark of every dirty conversation.
func (f *Fanout) advance() {
	f.dmu.Lock()
	convs := make([]string, 0, len(f.dirty))
	for c := range f.dirty {
		convs = append(convs, c)
	}
	clear(f.dirty)
	f.dmu.Unlock()
	for len(convs) > 0 {
		n := min(len(convs), 500)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := f.st.AdvanceDense(ctx, convs[:n]); err != nil {
			f.log.Debug("advancing dense_seq", "err", err)
		}
		cancel()
		convs = convs[n:]
	}
}

func (f *Fanout) work() {
	defer f.wg.Done()
	for evs := range f.queue {
		// Take whatever else is queued too: one store query and one
		// routing lookup serve them all.
	more:
		for len(evs) < 512 {
			select {
			case more, ok := <-f.queue:
				if !ok {
					break more
				}
				evs = append(evs, more...)
			default:
				break more
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := f.deliver(ctx, evs); err != nil {
			f.log.Warn("fan-out failed; clients will catch up by sync", "events", len(evs), "err", err)
		}
		f.markDirty(evs)
		cancel()
	}
}

func (f *Fanout) deliver(ctx context.Context, evs []eventlog.Committed) error {
	keys := make([]store.ConvSeq, len(evs))
	for i, e := range evs {
		keys[i] = store.ConvSeq{Conv: e.Conv, Seq: e.Seq}
	}
	recipients, err := f.st.Recipients(ctx, keys)
	if err != nil {
		return err
	}
	userSet := map[string]bool{}
	var users []string
	for _, rs := range recipients {
		for _, u := range rs {
			if !userSet[u] {
				userSet[u] = true
				users = append(users, u)
			}
		}
	}
	if len(users) == 0 {
		return nil
	}
	entries, err := f.routes.Lookup(ctx, users)
	if err != nil {
		return err
	}
	byUser := map[string][]route.Entry{}
	for _, e := range entries {
		byUser[e.User] = append(byUser[e.User], e)
	}
	perGateway := map[string][]Delivery{}
	for i, e := range evs {
		var frame []byte
		for _, u := range recipients[i] {
			for _, r := range byUser[u] {
				if r.Device == e.Device {
					continue // the sender's device got send_ok instead
				}
				if frame == nil {
					if frame, err = PushFrame(e.Event); err != nil {
						return err
					}
				}
				ds := perGateway[r.Gateway]
				if n := len(ds); n > 0 && &ds[n-1].Frame[0] == &frame[0] {
					ds[n-1].Targets = append(ds[n-1].Targets, Target{Device: r.Device, Token: r.Token})
				} else {
					ds = append(ds, Delivery{Conv: e.Conv, Seq: e.Seq, Frame: frame, Targets: []Target{{Device: r.Device, Token: r.Token}}})
				}
				perGateway[r.Gateway] = ds
			}
		}
	}
	for gw, ds := range perGateway {
		if gw == f.routes.Gateway() {
			f.local.Deliver(ds)
			continue
		}
		if err := f.bus.Publish(ctx, gw, ds); err != nil {
			f.log.Warn("publishing to gateway", "gateway", gw, "err", err)
		}
	}
	return nil
}

// PushFrame encodes e as a push frame.
func PushFrame(e store.Event) ([]byte, error) {
	p := wire.Push{T: wire.TPush, Conv: e.Conv, Seq: e.Seq, Kind: e.Kind.String(), Sender: e.Sender, Body: e.Body,
		Ts: e.Ts, Cmid: e.Cmid, Target: e.Target, Users: e.Users}
	return wire.AppendFrame(nil, p)
}

// Mode is the fan-out tier of a conversation with n current members
// (PROTOCOL.md §4 convs.mode): "push" below writeMax, "online" up to
// onlineMax, "pull" above.
func Mode(n int64, writeMax, onlineMax int) string {
	switch {
	case n < int64(writeMax):
		return "push"
	case n <= int64(onlineMax):
		return "online"
	}
	return "pull"
}

// ToUser sends frame to every online device of user except one (e.g.
// read_changed to the user's other devices), on whichever gateways hold
// them. The frame is never dropped for a slow device (it is small).
func (f *Fanout) ToUser(ctx context.Context, user, exceptDevice string, frame []byte) error {
	entries, err := f.routes.Lookup(ctx, []string{user})
	if err != nil {
		return err
	}
	perGateway := map[string][]Target{}
	for _, e := range entries {
		if e.Device != exceptDevice {
			perGateway[e.Gateway] = append(perGateway[e.Gateway], Target{Device: e.Device, Token: e.Token})
		}
	}
	for gw, ts := range perGateway {
		ds := []Delivery{{Frame: frame, Targets: ts}}
		if gw == f.routes.Gateway() {
			f.local.Deliver(ds)
		} else if err := f.bus.Publish(ctx, gw, ds); err != nil {
			return err
		}
	}
	return nil
}
