package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
	"github.com/parley-im/parley/wire"
)

// tierConfigs force one five-member group (four while c is out) into each
// fan-out tier, and across tiers while the scenario runs.
var tierConfigs = []struct {
	name                string
	writeMax, onlineMax int
	coalesce            time.Duration // push_coalesce
}{
	{"push", 6, 10, 0},         // 4–5 members: push
	{"online", 3, 10, 0},       // online
	{"pull", 2, 3, 0},          // pull
	{"online<->push", 5, 5, 0}, // 5: online, 4: push, 5: online again
	{"pull<->online", 2, 4, 0}, // 5: pull, 4: online, 5: pull again
	// Big groups' pushes held up to 50 ms to share writes: only later.
	{"pull<->online, coalesced", 2, 4, 50 * time.Millisecond},
}

// recorder keeps the frames one device receives.
type recorder struct {
	mu     sync.Mutex
	pushes []string // "seq:kind"
	reads  []string // "read:unread"
}

func (r *recorder) on(m wire.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch m.T {
	case wire.TPush:
		r.pushes = append(r.pushes, fmt.Sprintf("%d:%s", m.Seq, m.Kind))
	case wire.TReadChanged:
		r.reads = append(r.reads, fmt.Sprintf("%d:%d", m.Read, m.Unread))
	}
}

func (r *recorder) snapshot() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := slices.Clone(r.pushes)
	slices.Sort(p)
	return fmt.Sprintf("pushes %v read_changed %v", p, r.reads)
}

// tierScenario runs one scripted history in group "g" on a server with the
// given thresholds and returns everything clients can see, minus
// timestamps and mode.
func tierScenario(t *testing.T, writeMax, onlineMax int, coalesce time.Duration) (result string, modes []string) {
	cfg := parleytest.Config(t)
	cfg.WriteFanoutMax, cfg.OnlineFanoutMax = writeMax, onlineMax
	cfg.PushCoalesce = coalesce
	env := parleytest.Start(t, cfg)
	devs := map[string][]parleytest.Device{}
	for _, u := range []string{"a", "b", "c", "d", "e"} {
		n := 1
		if u == "b" {
			n = 2
		}
		devs[u] = env.User(t, u, n)
	}
	env.Group(t, "g", "a", "b", "c", "d", "e")
	recs := map[string]*recorder{}
	conns := map[string]*client.Conn{}
	connect := func(d parleytest.Device) *client.Conn {
		rec := recs[d.ID]
		if rec == nil {
			rec = &recorder{}
			recs[d.ID] = rec
		}
		c, err := client.Dial(ctx(t), env.Addr, d.ID, d.Token, client.DialOptions{OnServerFrame: rec.on})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns[d.ID] = c
		return c
	}
	pg, err := pgx.Connect(ctx(t), cfg.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close(context.Background())
	// quiesce waits until fan-out has handed every committed event of g
	// to the gateway (send_ok may precede the hand-off by a little), then
	// until every open connection has read what it was handed: a reply
	// leaves a connection's outbox after every frame queued on it before
	// (a held coalesced push goes out with it), and the client reads
	// frames in order, so once a ping's pong is back the recorder has
	// them.
	quiesce := func() {
		testenv.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
			var committed int64
			if err := pg.QueryRow(ctx(t), `SELECT count(*) FROM events WHERE conv_key = (SELECT conv_key FROM conversations WHERE conv_id = 'g')`).Scan(&committed); err != nil {
				return err
			}
			if fanned := int64(env.Srv.MetricSum("parley_fanout_events_total")); fanned < committed {
				return fmt.Errorf("%d of %d committed events fanned out", fanned, committed)
			}
			if n := env.Srv.FanoutPending(); n > 0 {
				return fmt.Errorf("%d events wait for fan-out", n)
			}
			return nil
		})
		for id, c := range conns {
			select {
			case <-c.Done():
				continue // closed by the scenario
			default:
			}
			if err := c.Ping(ctx(t)); err != nil {
				t.Fatalf("ping on %s's connection: %v", id, err)
			}
		}
	}
	quiesce() // the creation's fan-out, before anyone connects
	a := connect(devs["a"][0])
	b1 := connect(devs["b"][0])
	connect(devs["b"][1])
	cc := connect(devs["c"][0])
	e := connect(devs["e"][0])
	// d is offline for now.
	send := func(c *client.Conn, cmid string) int64 {
		r, err := c.Send(ctx(t), "g", cmid, []byte("body-"+cmid))
		if err != nil {
			t.Fatalf("send %s: %v", cmid, err)
		}
		return r.Seq
	}
	mode := func() {
		c, err := a.Convs(ctx(t), 0, "")
		if err != nil || len(c.Items) != 1 {
			t.Fatalf("convs: %+v %v", c, err)
		}
		modes = append(modes, c.Items[0].Mode)
	}
	mode()
	s1 := send(a, "a1")
	send(a, "a2")
	send(b1, "b1")
	send(cc, "c1")
	send(b1, "b2")
	quiesce()
	if _, err := b1.Read(ctx(t), "g", s1+2); err != nil {
		t.Fatal(err)
	}
	// b's other device is told (read_changed), off the read's reply path
	// and fan-out's queue: wait for that frame itself.
	testenv.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		rec := recs[devs["b"][1].ID]
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if len(rec.reads) == 0 {
			return fmt.Errorf("no read_changed on b's other device")
		}
		return nil
	})
	if _, err := a.Recall(ctx(t), "g", s1+1); err != nil {
		t.Fatal(err)
	}
	quiesce()
	if _, err := a.Edit(ctx(t), "g", s1, []byte("body-a1-edited")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Edit(ctx(t), "g", s1+1, []byte("x")); wire.CodeOf(err) != wire.NotFound {
		t.Fatalf("edit of a recalled message: %v", err)
	}
	quiesce()
	if _, err := cc.Leave(ctx(t), "g"); err != nil {
		t.Fatal(err)
	}
	quiesce()
	mode()
	send(a, "a3") // c must not see this one
	quiesce()
	if _, err := a.AddMembers(ctx(t), "g", "c"); err != nil {
		t.Fatal(err)
	}
	quiesce()
	mode()
	send(a, "a4")
	quiesce() // a4's fan-out before d connects: d must not get it pushed
	d := connect(devs["d"][0])
	quiesce()
	send(cc, "c2")
	quiesce()
	e.Close()
	quiesce()
	send(b1, "b3")
	quiesce() // b3's fan-out before e is back: e must not get it pushed
	e = connect(devs["e"][0])
	quiesce()
	send(d, "d1")
	if _, err := cc.Read(ctx(t), "g", 1000); wire.CodeOf(err) != wire.CursorAhead {
		t.Fatalf("read ahead: %v", err)
	}
	quiesce() // d1's fan-out
	// b clears ("delete for me") past its read position: b's other device
	// hears of the read position; e clears less; c edits its c2.
	if _, err := b1.Clear(ctx(t), "g", s1+6); err != nil {
		t.Fatal(err)
	}
	testenv.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		rec := recs[devs["b"][1].ID]
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if len(rec.reads) < 2 {
			return fmt.Errorf("no read_changed for the clear on b's other device")
		}
		return nil
	})
	if _, err := e.Clear(ctx(t), "g", s1+2); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.Clear(ctx(t), "g", 1000); wire.CodeOf(err) != wire.CursorAhead {
		t.Fatalf("clear ahead: %v", err)
	}
	edited := send(cc, "c3")
	if _, err := cc.Edit(ctx(t), "g", edited, []byte("body-c3-edited")); err != nil {
		t.Fatal(err)
	}
	quiesce()

	var out strings.Builder
	users := map[string]*client.Conn{"a": a, "b": b1, "c": cc, "d": d, "e": e}
	for _, u := range []string{"a", "b", "c", "d", "e"} {
		c := users[u]
		cv, err := c.Convs(ctx(t), 0, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range cv.Items {
			fmt.Fprintf(&out, "%s convs: %s kind=%s head=%d min=%d epoch=%d read=%d unread=%d cleared=%d\n", u, it.Conv, it.Kind, it.Head, it.MinSeq, it.Epoch, it.Read, it.Unread, it.Cleared)
		}
		sn, err := c.Snapshot(ctx(t), []wire.ConvAfter{{Conv: "g", After: 0}})
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range sn.Items {
			fmt.Fprintf(&out, "%s snapshot: head=%d read=%d unread=%d skipped=%d", u, it.Head, it.Read, it.Unread, it.Skipped)
			for _, ev := range it.Events {
				fmt.Fprintf(&out, " [%d %s %q r=%v t=%d e=%v]", ev.Seq, ev.Kind, ev.Body, ev.Recalled, ev.Target, ev.Edited != 0)
			}
			out.WriteString("\n")
		}
		for after, page := int64(0), 0; page < 10; page++ {
			p, err := c.Sync(ctx(t), "g", after, 3)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&out, "%s sync after %d: upto=%d more=%v head=%d", u, after, p.Upto, p.More, p.Head)
			for _, ev := range p.Events {
				fmt.Fprintf(&out, " [%d %s %s %q %s r=%v t=%d %v e=%v]", ev.Seq, ev.Kind, ev.Sender, ev.Body, ev.Cmid, ev.Recalled, ev.Target, ev.Users, ev.Edited != 0)
			}
			out.WriteString("\n")
			if !p.More {
				break
			}
			after = p.Upto
		}
	}
	ids := make([]string, 0, len(recs))
	for id := range recs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		fmt.Fprintf(&out, "%s: %s\n", id, recs[id].snapshot())
	}
	return out.String(), modes
}

// TestTierInvariance: the same history in a group forced
// into each tier, and across tiers, gives identical client-visible
// results: convs items, unread, sync pages, snapshots, pushes and
// read_changed received by online devices, with recalls, edits and clears
// ("delete for me") in the history. Only convs' mode differs.
func TestTierInvariance(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	var want string
	for i, tc := range tierConfigs {
		got, modes := tierScenario(t, tc.writeMax, tc.onlineMax, tc.coalesce)
		t.Logf("%s: modes %v", tc.name, modes)
		wantModes := map[string][]string{
			"push": {"push", "push", "push"}, "online": {"online", "online", "online"}, "pull": {"pull", "pull", "pull"},
			"online<->push": {"online", "push", "online"}, "pull<->online": {"pull", "online", "pull"},
			"pull<->online, coalesced": {"pull", "online", "pull"},
		}[tc.name]
		if fmt.Sprint(modes) != fmt.Sprint(wantModes) {
			t.Errorf("%s: modes %v, want %v", tc.name, modes, wantModes)
		}
		if i == 0 {
			want = got
			if testing.Verbose() {
				t.Logf("client-visible results:\n%s", got)
			}
			continue
		}
		if got != want {
			t.Errorf("%s differs from push tier:\n--- push\n%s\n--- %s\n%s", tc.name, want, tc.name, got)
		}
	}
}

// TestJoinBoundary: a member who joined at seq J never
// gets an event below J, even when that event's fan-out runs after the
// join, in every tier. Members send as fast as they can while the
// newcomer is added.
func TestJoinBoundary(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	for _, tc := range tierConfigs[:3] {
		t.Run(tc.name, func(t *testing.T) {
			cfg := parleytest.Config(t)
			cfg.WriteFanoutMax, cfg.OnlineFanoutMax = tc.writeMax, tc.onlineMax
			cfg.SendRate = 0
			env := parleytest.Start(t, cfg)
			members, devs := env.Users(t, "m%d", 5)
			nu := env.User(t, "nu", 1)[0]
			env.Group(t, "g", members...)
			rec := &recorder{}
			nc, err := client.Dial(ctx(t), env.Addr, nu.ID, nu.Token, client.DialOptions{OnServerFrame: rec.on})
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			var wg sync.WaitGroup
			stop := make(chan struct{})
			var sent atomic.Int64
			for i, d := range devs[:4] {
				c, _ := dial(t, env, d)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; n < 400; n++ {
						select {
						case <-stop:
							return
						default:
						}
						sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						if _, err := c.Send(sctx, "g", fmt.Sprintf("%d-%d", i, n), []byte("x")); err == nil {
							sent.Add(1)
						}
						cancel()
					}
				}()
			}
			// The join lands among the sends: some committed before it,
			// and as many again after it.
			sentAtLeast := func(n int64) {
				testenv.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
					if got := sent.Load(); got < n {
						return fmt.Errorf("%d sends confirmed, want %d", got, n)
					}
					return nil
				})
			}
			sentAtLeast(40)
			adder, _ := dial(t, env, devs[4])
			j, err := adder.AddMembers(ctx(t), "g", "nu")
			if err != nil {
				t.Fatal(err)
			}
			sentAtLeast(sent.Load() + 40)
			close(stop)
			wg.Wait()
			// The join's seq: the first event nu may see.
			p, err := nc.Sync(ctx(t), "g", 0, 1)
			if err != nil || len(p.Events) != 1 || p.Events[0].Kind != "join" {
				t.Fatalf("nu's first event: %+v %v (members_ok head %d)", p, err, j.Head)
			}
			joinSeq := p.Events[0].Seq
			var last int64
			testenv.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
				rec.mu.Lock()
				defer rec.mu.Unlock()
				if len(rec.pushes) == 0 {
					return fmt.Errorf("nu got no push")
				}
				return nil
			})
			rec.mu.Lock()
			defer rec.mu.Unlock()
			below := 0
			for _, ps := range rec.pushes {
				var seq int64
				fmt.Sscanf(ps, "%d:", &seq)
				if seq < joinSeq {
					below++
				}
				last = max(last, seq)
			}
			t.Logf("join at %d; nu got %d pushes up to %d, %d below the join", joinSeq, len(rec.pushes), last, below)
			if below > 0 {
				t.Fatalf("%d pushes below the join seq %d", below, joinSeq)
			}
		})
	}
}
