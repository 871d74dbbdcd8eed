package e2e_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/wire"
)

// nextFrame returns the first frame of frames that match accepts, or fails
// after within.
func nextFrame(t *testing.T, frames chan wire.Message, within time.Duration, what string, match func(wire.Message) bool) wire.Message {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case m := <-frames:
			if match(m) {
				return m
			}
		case <-deadline:
			t.Fatalf("no %s within %s", what, within)
		}
	}
}

// noFrame fails if a frame matching match arrives within d.
func noFrame(t *testing.T, frames chan wire.Message, d time.Duration, what string, match func(wire.Message) bool) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case m := <-frames:
			if match(m) {
				t.Fatalf("unexpected %s: %+v", what, m)
			}
		case <-deadline:
			return
		}
	}
}

// mustType writes a typing frame for conv on c.
func mustType(t *testing.T, c *client.Conn, conv string) {
	t.Helper()
	if err := c.Typing(conv); err != nil {
		t.Fatalf("typing %s: %v", conv, err)
	}
}

func isEvent(conv, kind string) func(wire.Message) bool {
	return func(m wire.Message) bool { return m.T == wire.TPush && m.Conv == conv && m.Kind == kind }
}

func isTyping(conv, user string) func(wire.Message) bool {
	return func(m wire.Message) bool { return m.T == wire.TTyping && m.Conv == conv && m.User == user }
}

// typing reaches the other current members' online devices (not the
// typist's own other devices) in push-tier conversations, at most once per
// device and conversation per 2 s; nothing is stored. A non-member gets
// NOT_MEMBER; in an online-tier conversation it is skipped silently.
func TestTyping(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	cfg.WriteFanoutMax, cfg.OnlineFanoutMax = 4, 10 // g (3 members): push; big (4): online
	env := parleytest.Start(t, cfg)
	ana := env.User(t, "ana", 2)
	ben := env.User(t, "ben", 1)[0]
	cy := env.User(t, "cy", 1)[0]
	out := env.User(t, "out", 1)[0]
	env.User(t, "dan", 1)
	env.Group(t, "g", "ana", "ben", "cy")
	env.Group(t, "big", "ana", "ben", "cy", "dan")
	ca, _ := dial(t, env, ana[0])
	_, fa2 := dial(t, env, ana[1])
	_, fb := dial(t, env, ben)
	_, fc := dial(t, env, cy)
	co, fo := dial(t, env, out)
	head := headOf(t, env, "g")

	mustType(t, ca, "g")
	nextFrame(t, fb, 5*time.Second, "typing on ben's device", isTyping("g", "ana"))
	nextFrame(t, fc, 5*time.Second, "typing on cy's device", isTyping("g", "ana"))
	// A flood within 2 s: dropped.
	for range 20 {
		mustType(t, ca, "g")
	}
	noFrame(t, fb, 500*time.Millisecond, "a second typing within 2 s", isTyping("g", "ana"))
	noFrame(t, fa2, 0, "typing on the typist's other device", isTyping("g", "ana"))
	time.Sleep(2 * time.Second) // the interval passing is what is tested
	mustType(t, ca, "g")
	nextFrame(t, fb, 5*time.Second, "typing after 2 s", isTyping("g", "ana"))

	// In the online tier: skipped, no error.
	mustType(t, ca, "big")
	noFrame(t, fb, 500*time.Millisecond, "typing in an online-tier conversation", isTyping("big", "ana"))
	// A non-member: NOT_MEMBER (a frame without rid).
	mustType(t, co, "g")
	m := nextFrame(t, fo, 5*time.Second, "NOT_MEMBER for typing", func(m wire.Message) bool { return m.T == wire.TError })
	if m.Code != wire.NotMember {
		t.Fatalf("typing by a non-member: %+v", m)
	}
	noFrame(t, fb, 300*time.Millisecond, "typing of a non-member", isTyping("g", "out"))
	if h := headOf(t, env, "g"); h != head {
		t.Fatalf("typing moved head %d -> %d", head, h)
	}
}

func isReceipt(conv, user string) func(wire.Message) bool {
	return func(m wire.Message) bool { return m.T == wire.TReceipt && m.Conv == conv && m.User == user }
}

// The routes the relay reuses for a user are dropped when a connection of
// that user opens on the gateway: a device that just connected gets the
// next typing frame, not one a few seconds later.
func TestTypingReachesNewDevice(t *testing.T) {
	t.Parallel()
	env := parleytest.Start(t, parleytest.Config(t))
	ana := env.User(t, "ana", 2)
	ben := env.User(t, "ben", 2)
	env.Group(t, "g", "ana", "ben")
	ca1, _ := dial(t, env, ana[0])
	ca2, _ := dial(t, env, ana[1])
	_, fb1 := dial(t, env, ben[0])
	mustType(t, ca1, "g")
	nextFrame(t, fb1, 5*time.Second, "typing on ben's first device", isTyping("g", "ana"))
	_, fb2 := dial(t, env, ben[1])
	mustType(t, ca2, "g") // another device of ana: not held by the first one's interval
	nextFrame(t, fb2, time.Second, "typing on ben's new device", isTyping("g", "ana"))
}

// receipts lists the current members' read positions (push tier only);
// a member's read advance reaches the other members' online devices as a
// receipt, at most one per (conversation, user) a second over all
// gateways, the newest position last; users with receipts_private are left
// out of both.
func TestReceipts(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	cfg.WriteFanoutMax, cfg.OnlineFanoutMax = 4, 10
	gw1 := parleytest.Start(t, cfg)
	gw2 := parleytest.Start(t, cfg)
	ana := gw1.User(t, "ana", 1)[0]
	ben := gw1.User(t, "ben", 2)
	cy := gw1.User(t, "cy", 1)[0]
	out := gw1.User(t, "out", 1)[0]
	gw1.User(t, "dan", 1)
	gw1.Group(t, "g", "ana", "ben", "cy")
	gw1.Group(t, "big", "ana", "ben", "cy", "dan")
	ca, fa := dial(t, gw1, ana)
	cb1, _ := dial(t, gw1, ben[0])
	cb2, fb2 := dial(t, gw2, ben[1])
	cc, fc := dial(t, gw2, cy)
	co, _ := dial(t, gw1, out)
	var seqs []int64
	for i := range 5 {
		m, err := ca.Send(ctx(t), "g", string(rune('a'+i)), []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, m.Seq)
	}

	r, err := cb1.Receipts(ctx(t), "g")
	if err != nil || len(r.Reads) != 3 {
		t.Fatalf("receipts: %+v %v", r, err)
	}
	for _, u := range r.Reads {
		if u.Read != 0 && u.User != "ana" {
			t.Fatalf("receipts before any read: %+v", r.Reads)
		}
	}
	if _, err := co.Receipts(ctx(t), "g"); wire.CodeOf(err) != wire.NotMember {
		t.Fatalf("receipts by a non-member: %v", err)
	}
	if _, err := ca.Receipts(ctx(t), "big"); wire.CodeOf(err) != wire.Forbidden {
		t.Fatalf("receipts in an online-tier conversation: %v", err)
	}

	// ben reads on gw1: ana (gw1) and cy (gw2) get a receipt; ben's other
	// device gets read_changed only.
	if _, err := cb1.Read(ctx(t), "g", seqs[1]); err != nil {
		t.Fatal(err)
	}
	for who, frames := range map[string]chan wire.Message{"ana": fa, "cy": fc} {
		m := nextFrame(t, frames, 5*time.Second, "receipt on "+who, isReceipt("g", "ben"))
		if m.Read != seqs[1] {
			t.Fatalf("%s: receipt %+v, want read %d", who, m, seqs[1])
		}
	}
	noFrame(t, fb2, 200*time.Millisecond, "a receipt on the reader's own device", isReceipt("g", "ben"))
	// Reads on both gateways within the window: one receipt when it
	// closes, with the newest position.
	start := time.Now()
	if _, err := cb2.Read(ctx(t), "g", seqs[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := cb1.Read(ctx(t), "g", seqs[3]); err != nil {
		t.Fatal(err)
	}
	m := nextFrame(t, fa, 5*time.Second, "the coalesced receipt", isReceipt("g", "ben"))
	if m.Read != seqs[3] || time.Since(start) < 500*time.Millisecond {
		t.Fatalf("coalesced receipt %+v after %s, want read %d about a second after the first", m, time.Since(start), seqs[3])
	}
	noFrame(t, fa, 1500*time.Millisecond, "a second coalesced receipt", isReceipt("g", "ben"))
	r, err = ca.Receipts(ctx(t), "g")
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range r.Reads {
		if u.User == "ben" && u.Read != seqs[3] {
			t.Fatalf("receipts: ben at %d, want %d", u.Read, seqs[3])
		}
	}

	// cy goes private: left out of receipts, and cy's reads send none.
	if s, err := cc.SetReceiptsPrivate(ctx(t), true); err != nil || !s.ReceiptsPrivate {
		t.Fatalf("settings: %+v %v", s, err)
	}
	r, err = ca.Receipts(ctx(t), "g")
	if err != nil || len(r.Reads) != 2 {
		t.Fatalf("receipts with cy private: %+v %v", r.Reads, err)
	}
	for _, u := range r.Reads {
		if u.User == "cy" {
			t.Fatalf("receipts show a private user: %+v", r.Reads)
		}
	}
	if _, err := cc.Read(ctx(t), "g", seqs[4]); err != nil {
		t.Fatal(err)
	}
	noFrame(t, fa, 1500*time.Millisecond, "a receipt of a private user", isReceipt("g", "cy"))
	if s, err := cc.SetReceiptsPrivate(ctx(t), false); err != nil || s.ReceiptsPrivate {
		t.Fatalf("settings back: %+v %v", s, err)
	}
	r, err = ca.Receipts(ctx(t), "g")
	if err != nil || len(r.Reads) != 3 {
		t.Fatalf("receipts with cy public again: %+v %v", r.Reads, err)
	}
}

// Reads that move at the same moment go through the receipt gate
// together (one Redis pipeline for all those of a short linger); each
// still gets its own receipt, in its own conversation, and of two reads
// of one user in one conversation only the newest is sent.
func TestReceiptsTogether(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	env := parleytest.Start(t, cfg)
	ana := env.User(t, "ana", 1)[0]
	ben := env.User(t, "ben", 2)
	cy := env.User(t, "cy", 1)[0]
	env.Group(t, "g1", "ana", "ben", "cy")
	env.Group(t, "g2", "ana", "ben", "cy")
	ca, fa := dial(t, env, ana)
	cb1, _ := dial(t, env, ben[0])
	cb2, _ := dial(t, env, ben[1])
	cc, _ := dial(t, env, cy)
	seqs := map[string][]int64{}
	for _, conv := range []string{"g1", "g2"} {
		for i := range 3 {
			m, err := ca.Send(ctx(t), conv, conv+string(rune('a'+i)), []byte("x"))
			if err != nil {
				t.Fatal(err)
			}
			seqs[conv] = append(seqs[conv], m.Seq)
		}
	}
	type read struct {
		c    *client.Conn
		conv string
		seq  int64
	}
	reads := []read{
		{cb1, "g1", seqs["g1"][0]}, {cb2, "g1", seqs["g1"][2]}, // ben in g1: the newest is sent
		{cb1, "g2", seqs["g2"][1]},
		{cc, "g1", seqs["g1"][1]},
	}
	var wg sync.WaitGroup
	for _, r := range reads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := r.c.Read(ctx(t), r.conv, r.seq); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	want := map[[2]string]int64{{"g1", "ben"}: seqs["g1"][2], {"g2", "ben"}: seqs["g2"][1], {"g1", "cy"}: seqs["g1"][1]}
	got := map[[2]string]int64{}
	deadline := time.After(5 * time.Second)
	for len(got) < len(want) {
		select {
		case m := <-fa:
			if m.T == wire.TReceipt {
				got[[2]string{m.Conv, m.User}] = max(got[[2]string{m.Conv, m.User}], m.Read)
			}
		case <-deadline:
			t.Fatalf("receipts on ana: %v, want %v", got, want)
		}
	}
	// A lower read of ben in g1 may have gone out first only if it was
	// gated before the newer one arrived; the newest must follow within
	// the window.
	if got[[2]string{"g1", "ben"}] != want[[2]string{"g1", "ben"}] {
		m := nextFrame(t, fa, 3*time.Second, "ben's newest receipt in g1", isReceipt("g1", "ben"))
		got[[2]string{"g1", "ben"}] = m.Read
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("receipt of %s in %s: read %d, want %d", k[1], k[0], got[k], w)
		}
	}
}

// Gateways cache a push-tier conversation's member list for typing (and
// receipts) for long, so a join or a removal on any gateway must drop it
// on every gateway at once: a new member's typing is relayed (not refused
// as NOT_MEMBER) and the others' reaches it, and a removed member's
// devices get none, once the change's event reached the gateway (the
// bus carries the notice before the event's push). Two gateways
// share PostgreSQL and Redis; each change is made through the other
// gateway's admin API than the one whose cache it must drop.
func TestTypingFollowsMembership(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	cfg1, cfg2 := cfg, cfg
	cfg1.GatewayID, cfg2.GatewayID = "tgw-1", "tgw-2"
	gw1 := parleytest.Start(t, cfg1)
	gw2 := parleytest.Start(t, cfg2)
	ana := gw1.User(t, "ana", 1)[0]
	ben := gw1.User(t, "ben", 1)[0]
	cy := gw1.User(t, "cy", 1)[0]
	gw1.Group(t, "g", "ana", "ben")
	ca, fa := dial(t, gw1, ana)
	cb, fb := dial(t, gw2, ben)
	cc, fc := dial(t, gw2, cy)

	// Both gateways now hold g's list: {ana, ben}.
	first := time.Now()
	mustType(t, ca, "g")
	nextFrame(t, fb, 5*time.Second, "ana's typing on ben's device", isTyping("g", "ana"))
	mustType(t, cb, "g")
	nextFrame(t, fa, 5*time.Second, "ben's typing on ana's device", isTyping("g", "ben"))

	// cy joins through gateway 1: gateway 2 relays cy's typing at once.
	var add struct{ Head int64 }
	if st := gw1.Admin(t, "POST", "/v1/conversations/g/members", map[string]any{"users": []string{"cy"}}, &add); st != http.StatusOK {
		t.Fatalf("adding cy: status %d", st)
	}
	// The admin call's reply may reach the test before gateway 2 heard
	// the notice; the join's push to cy's device comes after it.
	nextFrame(t, fc, 5*time.Second, "the join on cy's device", isEvent("g", wire.KindJoin))
	mustType(t, cc, "g")
	nextFrame(t, fa, 5*time.Second, "the new member's typing on ana's device", isTyping("g", "cy"))
	noFrame(t, fc, 300*time.Millisecond, "an error for the new member's typing", func(m wire.Message) bool { return m.T == wire.TError })

	// ben is removed through gateway 2: gateway 1 relays ana's next
	// typing to cy and not to ben.
	if st := gw2.Admin(t, "DELETE", "/v1/conversations/g/members/ben", nil, nil); st != http.StatusOK {
		t.Fatalf("removing ben: status %d", st)
	}
	nextFrame(t, fa, 5*time.Second, "ben's leave on ana's device", isEvent("g", wire.KindLeave))
	time.Sleep(time.Until(first.Add(2100 * time.Millisecond))) // ana's typing interval passing
	mustType(t, ca, "g")
	nextFrame(t, fc, 5*time.Second, "ana's typing on the new member's device", isTyping("g", "ana"))
	noFrame(t, fb, 500*time.Millisecond, "typing on the removed member's device", isTyping("g", "ana"))
}

// A device that connects on another gateway gets the next typing frame
// relayed through a gateway that had looked its user's routes up just
// before: the new connection's gateway announces it before answering its
// auth, and every gateway drops the routes it reuses for that user.
func TestTypingFollowsDeviceToAnotherGateway(t *testing.T) {
	t.Parallel()
	cfg := parleytest.Config(t)
	cfg1, cfg2 := cfg, cfg
	cfg1.GatewayID, cfg2.GatewayID = "mgw-1", "mgw-2"
	gw1 := parleytest.Start(t, cfg1)
	gw2 := parleytest.Start(t, cfg2)
	ana := gw1.User(t, "ana", 2)
	ben := gw1.User(t, "ben", 2)
	gw1.Group(t, "g", "ana", "ben")
	ca1, _ := dial(t, gw1, ana[0])
	ca2, _ := dial(t, gw1, ana[1])
	_, fb1 := dial(t, gw1, ben[0])
	// Gateway 1 looks ben's routes up (one device, on gateway 1) and
	// reuses them for the next typing and receipts.
	mustType(t, ca1, "g")
	nextFrame(t, fb1, 5*time.Second, "typing on ben's first device", isTyping("g", "ana"))
	_, fb2 := dial(t, gw2, ben[1])
	mustType(t, ca2, "g") // another device of ana: not held by the first one's interval
	nextFrame(t, fb2, time.Second, "typing on ben's device on the other gateway", isTyping("g", "ana"))
	nextFrame(t, fb1, time.Second, "typing on ben's first device", isTyping("g", "ana"))
}
