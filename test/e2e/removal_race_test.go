package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
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

// Membership changes and sends of a conversation are ordered
// (docs/consistency.md, "Membership changes and sends"): a send is
// confirmed only if its seq falls inside the sender's membership period,
// so once a user's leave has seq L, nothing of theirs above L is stored,
// confirmed or delivered, and their devices get the leave and nothing
// after it. The tests below race that on two gateways, many times: three
// devices of x send as fast as they can (on gw1, gw2, gw1) while x is
// removed through the admin API, or leaves from one of them, or is
// removed and added back at once.

// raceIterations is how many times each race runs
// (PARLEY_RACE_ITERATIONS overrides it).
func raceIterations(t *testing.T) int {
	if s := os.Getenv("PARLEY_RACE_ITERATIONS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	return 200
}

// raceFix is two gateways, x with three devices (d1, d3 on gw1, d2 on
// gw2) and w, a member who stays, with a device on each gateway.
type raceFix struct {
	t        *testing.T
	gw1, gw2 *parleytest.Env
	pg       *pgx.Conn
	x        [3]*client.Conn
	xDevs    []parleytest.Device
	w1, w2   *client.Conn
	pushes   sync.Map // device id → *pushLog
}

// pushLog records the seqs of the pushes a device got, per conversation.
type pushLog struct {
	mu   sync.Mutex
	seqs map[string][]int64
	kind map[string]map[int64]string
}

func (l *pushLog) add(m wire.Message) {
	if m.T != wire.TPush {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seqs[m.Conv] = append(l.seqs[m.Conv], m.Seq)
	if l.kind[m.Conv] == nil {
		l.kind[m.Conv] = map[int64]string{}
	}
	l.kind[m.Conv][m.Seq] = m.Kind
}

func (l *pushLog) of(conv string) ([]int64, map[int64]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int64(nil), l.seqs[conv]...), l.kind[conv]
}

func newRaceFix(t *testing.T) *raceFix {
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	f := &raceFix{t: t, gw1: parleytest.Start(t, cfg), gw2: parleytest.Start(t, cfg)}
	f.xDevs = f.gw1.User(t, "x", 3)
	wDevs := f.gw1.User(t, "w", 2)
	for i, d := range f.xDevs {
		env := f.gw1
		if i == 1 {
			env = f.gw2
		}
		f.x[i] = f.dial(env, d)
	}
	f.w1, f.w2 = f.dial(f.gw1, wDevs[0]), f.dial(f.gw2, wDevs[1])
	pg, err := pgx.Connect(context.Background(), cfg.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(context.Background()) })
	f.pg = pg
	return f
}

func (f *raceFix) dial(env *parleytest.Env, dev parleytest.Device) *client.Conn {
	l := &pushLog{seqs: map[string][]int64{}, kind: map[string]map[int64]string{}}
	f.pushes.Store(dev.ID, l)
	c, err := client.Dial(ctx(f.t), env.Addr, dev.ID, dev.Token, client.DialOptions{OnServerFrame: l.add})
	if err != nil {
		f.t.Fatalf("dial %s: %v", dev.ID, err)
	}
	f.t.Cleanup(func() { c.Close() })
	return c
}

func (f *raceFix) log(dev string) *pushLog {
	l, _ := f.pushes.Load(dev)
	return l.(*pushLog)
}

// senders runs x's three devices sending to conv as fast as they can
// until stop is closed (or, if untilRefused, until a send is refused);
// wait returns the seqs confirmed. warm is closed once every device has
// had two sends confirmed (so the removal races sends in flight).
func (f *raceFix) senders(conv string, stop <-chan struct{}, untilRefused bool) (wait func() []int64, warm <-chan struct{}) {
	var mu sync.Mutex
	var confirmed []int64
	var wg sync.WaitGroup
	var warmed atomic.Int32
	warmC := make(chan struct{})
	for i, c := range f.x {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok := 0
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				r, err := c.Send(cctx, conv, fmt.Sprintf("d%d-%d", i, n), []byte("x"))
				cancel()
				switch {
				case err == nil:
					mu.Lock()
					confirmed = append(confirmed, r.Seq)
					mu.Unlock()
					if ok++; ok == 2 && warmed.Add(1) == int32(len(f.x)) {
						close(warmC)
					}
				case wire.CodeOf(err) == wire.NotMember: // after the removal
					if untilRefused {
						return
					}
				default:
					f.t.Errorf("send by x's device %d: %v", i, err)
					return
				}
			}
		}()
	}
	return func() []int64 { wg.Wait(); mu.Lock(); defer mu.Unlock(); return confirmed }, warmC
}

// barrier makes w send a marker and waits until both of w's devices
// (one per gateway) got it pushed: fan-out delivers a conversation's
// events in order, so every push before it was handed to both gateways.
func (f *raceFix) barrier(conv string) int64 {
	f.t.Helper()
	r, err := f.w1.Send(ctx(f.t), conv, fmt.Sprintf("marker-%d", time.Now().UnixNano()), []byte("m"))
	if err != nil {
		f.t.Fatalf("marker: %v", err)
	}
	// w1 sent it (send_ok, no push); w2 gets it pushed, and so does the
	// next marker from w2 reach w1.
	r2, err := f.w2.Send(ctx(f.t), conv, fmt.Sprintf("marker2-%d", time.Now().UnixNano()), []byte("m"))
	if err != nil {
		f.t.Fatalf("marker: %v", err)
	}
	for _, w := range []struct {
		dev string
		seq int64
	}{{"w-d2", r.Seq}, {"w-d1", r2.Seq}} {
		testenv.CheckFor(f.t, 10*time.Second, 2*time.Millisecond, func() error {
			seqs, _ := f.log(w.dev).of(conv)
			for _, s := range seqs {
				if s == w.seq {
					return nil
				}
			}
			return fmt.Errorf("%s has no push of marker %d in %s", w.dev, w.seq, conv)
		})
	}
	return r2.Seq
}

// check asserts what a removal at leave must leave behind: every
// confirmed send of x below leave, none of x's events above it stored,
// head (the removal's reply) at least leave, the devices in pushed (those
// that did not cause the leave) given the leave, and none of x's devices
// given anything after it.
func (f *raceFix) check(it int, conv string, leave, head int64, confirmed []int64, pushed []string) {
	t := f.t
	t.Helper()
	for _, s := range confirmed {
		if s > leave {
			t.Fatalf("iteration %d: x's send confirmed with seq %d after x's leave at %d", it, s, leave)
		}
	}
	var after int64
	if err := f.pg.QueryRow(ctx(t), `SELECT count(*) FROM events WHERE conv_key = (SELECT conv_key FROM conversations WHERE conv_id = $1) AND sender = 'x' AND kind = 1 AND seq > $2`, conv, leave).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != 0 {
		t.Fatalf("iteration %d: %d messages of x stored after x's leave at %d", it, after, leave)
	}
	if head < leave {
		t.Fatalf("iteration %d: the removal's reply says head %d, below its leave %d", it, head, leave)
	}
	for _, dev := range pushed {
		testenv.CheckFor(t, 10*time.Second, 2*time.Millisecond, func() error {
			seqs, kinds := f.log(dev).of(conv)
			for _, s := range seqs {
				if s == leave && kinds[s] == "leave" {
					return nil
				}
			}
			return fmt.Errorf("iteration %d: %s (x's) never got x's leave at %d", it, dev, leave)
		})
	}
	f.nothingAfter(it, conv, leave)
}

// nothingAfter fails if one of x's devices was pushed an event of conv
// after x's leave at leave.
func (f *raceFix) nothingAfter(it int, conv string, leave int64) {
	for _, d := range f.xDevs {
		seqs, kinds := f.log(d.ID).of(conv)
		for _, s := range seqs {
			if s > leave {
				f.t.Fatalf("iteration %d: %s (x's) was pushed seq %d (%s) of %s after x's leave at %d", it, d.ID, s, kinds[s], conv, leave)
			}
		}
	}
}

// leaveSeq is the seq of x's leave in conv (the newest one).
func (f *raceFix) leaveSeq(conv string) int64 {
	var s int64
	if err := f.pg.QueryRow(ctx(f.t), `SELECT max(seq) FROM events WHERE conv_key = (SELECT conv_key FROM conversations WHERE conv_id = $1) AND kind = 3 AND users = '{x}'`, conv).Scan(&s); err != nil {
		f.t.Fatal(err)
	}
	return s
}

func TestRemovalRacingSends(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	n := raceIterations(t)
	for _, how := range []string{"admin", "leave"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel() // each way on gateways, a database and keys of its own
			f := newRaceFix(t)
			leaves := map[string]int64{}
			for it := 0; it < n; it++ {
				conv := fmt.Sprintf("rm-%s-%d", how, it)
				f.gw1.Group(t, conv, "x", "w")
				stop := make(chan struct{})
				wait, warm := f.senders(conv, stop, true)
				<-warm
				var head int64
				pushed := []string{"x-d1", "x-d2", "x-d3"}
				switch how {
				case "admin": // on gw2: gw1's membership cache still says x is a member
					var out struct{ Head int64 }
					if st := f.gw2.Admin(t, "DELETE", "/v1/conversations/"+conv+"/members/x", nil, &out); st != http.StatusOK {
						t.Fatalf("iteration %d: removal: status %d", it, st)
					}
					head = out.Head
				case "leave": // from d3, while d1 and d2 send
					r, err := f.x[2].Leave(ctx(t), conv)
					if err != nil {
						t.Fatalf("iteration %d: leave: %v", it, err)
					}
					head, pushed = r.Head, pushed[:2]
				}
				confirmed := wait()
				close(stop)
				leave := f.leaveSeq(conv)
				f.barrier(conv)
				f.check(it, conv, leave, head, confirmed, pushed)
				leaves[conv] = leave
			}
			// Pushes still in flight at an iteration's check had time
			// to land since: look again.
			for conv, leave := range leaves {
				f.nothingAfter(-1, conv, leave)
			}
		})
	}
}

// TestReAddRacingSends: x is removed and at once added back while x's
// devices keep sending. A send is confirmed only inside one of x's
// periods: none with a seq between the leave and the re-add's join, and
// none of x's events stored there.
func TestReAddRacingSends(t *testing.T) {
	t.Parallel() // long and mostly waiting: see the Makefile's test target
	f := newRaceFix(t)
	n := raceIterations(t)
	for it := 0; it < n; it++ {
		conv := fmt.Sprintf("readd-%d", it)
		f.gw1.Group(t, conv, "x", "w")
		stop := make(chan struct{})
		wait, warm := f.senders(conv, stop, false)
		<-warm
		if st := f.gw2.Admin(t, "DELETE", "/v1/conversations/"+conv+"/members/x", nil, nil); st != http.StatusOK {
			t.Fatalf("iteration %d: removal: status %d", it, st)
		}
		var out struct{ Head int64 }
		if st := f.gw2.Admin(t, "POST", "/v1/conversations/"+conv+"/members", map[string]any{"users": []string{"x"}}, &out); st != http.StatusOK {
			t.Fatalf("iteration %d: re-add: status %d", it, st)
		}
		// Keep sending into the new period for a moment.
		var join int64
		if err := f.pg.QueryRow(ctx(t), `SELECT max(seq) FROM events WHERE conv_key = (SELECT conv_key FROM conversations WHERE conv_id = $1) AND kind = 2 AND users = '{x}'`, conv).Scan(&join); err != nil {
			t.Fatal(err)
		}
		testenv.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
			var n int64
			if err := f.pg.QueryRow(ctx(t), `SELECT count(*) FROM events WHERE conv_key = (SELECT conv_key FROM conversations WHERE conv_id = $1) AND sender = 'x' AND seq > $2`, conv, join).Scan(&n); err != nil || n < 3 {
				return fmt.Errorf("%d sends of x in the new period (%v)", n, err)
			}
			return nil
		})
		close(stop)
		confirmed := wait()
		leave := f.leaveSeq(conv)
		for _, s := range confirmed {
			if s > leave && s < join {
				t.Fatalf("iteration %d: x's send confirmed with seq %d, between x's leave %d and x's re-add %d", it, s, leave, join)
			}
		}
		var between int64
		if err := f.pg.QueryRow(ctx(t), `SELECT count(*) FROM events WHERE conv_key = (SELECT conv_key FROM conversations WHERE conv_id = $1) AND sender = 'x' AND kind = 1 AND seq > $2 AND seq < $3`,
			conv, leave, join).Scan(&between); err != nil {
			t.Fatal(err)
		}
		if between != 0 {
			t.Fatalf("iteration %d: %d messages of x stored between x's leave %d and re-add %d", it, between, leave, join)
		}
	}
}
