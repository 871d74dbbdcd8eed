package e2e_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/notify"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/wire"
)

// withdrawPair is two parleyd processes on one PostgreSQL and one Redis:
// b, a child process, is the gateway the senders use and the only one
// that sends notifications (to the sink); a, in-process, has no
// provider, and answers the changes that withdraw addresses (admin calls,
// and requests of devices connected to it). Every notification a test
// waits for is prepared and sent by b; what a answered must hold there.
type withdrawPair struct {
	s     *sink
	a     *parleytest.Env
	b     *parleytest.Env
	delay time.Duration
}

func startWithdrawPair(t *testing.T, delay time.Duration, concurrency int) *withdrawPair {
	t.Helper()
	s := newSink(t)
	cfg := notifyConfig(t, s, delay)
	if concurrency > 0 {
		cfg.NotifyConcurrency = concurrency
	}
	cfgA := cfg
	cfgA.NotifyWebhookURL, cfgA.NotifyWebhookSecret = "", ""
	a := parleytest.Start(t, cfgA)
	p := parleytest.StartProcess(t, cfg)
	return &withdrawPair{s: s, a: a, b: &parleytest.Env{Addr: p.Addr, AdminURL: p.AdminURL}, delay: delay}
}

// TestNotifyWithdrawnAddresses: for every change that withdraws a
// device's notification address, a notification pending (queued, not
// yet due) when the change is answered by one process is never sent to
// that address by the other, and nor is one of a message committed
// after it. A user removed or banned is notified of the messages of
// their membership period only, and gets no recall notification of one
// recalled after they left.
func TestNotifyWithdrawnAddresses(t *testing.T) {
	t.Parallel() // mostly waiting: see the Makefile's test target
	const delay = 600 * time.Millisecond
	w := startWithdrawPair(t, delay, 0)

	// setup makes ana (owner, two devices) and ben (one device,
	// registered with token "tok-ben" and offline) in group g, and has
	// ana's first device connected to b.
	setup := func(t *testing.T, name string) (p party) {
		anaID, benID, g := "ana-"+name, "ben-"+name, "g-"+name
		a := w.a.User(t, anaID, 2)
		p.ana2, p.g = a[1], g
		p.ben = w.a.User(t, benID, 1)[0]
		w.a.Group(t, g, anaID, benID)
		if st := w.a.Admin(t, "PUT", "/v1/conversations/"+g+"/members/"+anaID+"/role", map[string]string{"role": wire.RoleOwner}, nil); st != http.StatusOK {
			t.Fatalf("making %s owner: %d", anaID, st)
		}
		cb, _ := dial(t, w.b, p.ben)
		register(t, cb, "webhook", "tok-ben")
		cb.Close()
		p.ana, _ = dial(t, w.b, a[0])
		return p
	}
	// run sends a message, makes the change, sends another, and waits
	// for both messages' notify_delay and a collapse gap, and more.
	run := func(t *testing.T, name string, change func(t *testing.T, p party)) (p party, pending, after int64) {
		p = setup(t, name)
		pending = mustSend(t, p.ana, p.g, "m1", []byte("pending")).Seq
		change(t, p)
		after = mustSend(t, p.ana, p.g, "m2", []byte("after")).Seq
		time.Sleep(3*delay + time.Second) // a nothing-more-happens check
		return p, pending, after
	}

	for _, c := range withdrawals {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p, _, after := run(t, c.name, func(t *testing.T, p party) { c.change(t, w, p.ben) })
			got := w.s.of(p.ben.ID)
			for _, n := range got {
				if n.Token == "tok-ben" {
					t.Fatalf("notified at the withdrawn address: %+v", got)
				}
			}
			if c.name == "new token" && (len(got) == 0 || got[len(got)-1].Seq != after) {
				t.Fatalf("after a new token: %+v, want the last of seq %d", got, after)
			}
		})
	}
	for _, c := range []struct {
		name   string
		change func(t *testing.T, p party)
	}{
		{"removed", func(t *testing.T, p party) {
			if st := w.a.Admin(t, "DELETE", "/v1/conversations/"+p.g+"/members/"+p.ben.User, nil, nil); st != http.StatusOK {
				t.Fatalf("remove: %d", st)
			}
		}},
		{"banned", func(t *testing.T, p party) {
			co, _ := dial(t, w.a, p.ana2)
			if _, err := co.Ban(ctx(t), p.g, p.ben.User); err != nil {
				t.Fatalf("ban: %v", err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p, pending, _ := run(t, c.name, c.change)
			// The message of ben's period is notified, the one after
			// they left is not.
			if got := w.s.of(p.ben.ID); len(got) != 1 || got[0].Seq != pending || got[0].Count != 1 {
				t.Fatalf("after leaving: %+v, want one notification of seq %d", got, pending)
			}
		})
	}

	t.Run("recall after leaving", func(t *testing.T) {
		t.Parallel()
		p := setup(t, "recall")
		m := mustSend(t, p.ana, p.g, "m1", []byte("to recall"))
		w.s.waitFor(t, p.ben.ID, 1)
		if st := w.a.Admin(t, "DELETE", "/v1/conversations/"+p.g+"/members/"+p.ben.User, nil, nil); st != http.StatusOK {
			t.Fatalf("remove: %d", st)
		}
		if _, err := p.ana.Do(ctx(t), wire.Request{T: wire.TRecall, Conv: p.g, Seq: m.Seq}); err != nil {
			t.Fatalf("recall: %v", err)
		}
		w.s.exactly(t, p.ben.ID, 1, 2*delay+time.Second)
	})
}

// party is one case's users: ana (owner of g) connected to b with her
// first device, her second device, and ben.
type party struct {
	ana  *client.Conn
	ana2 parleytest.Device
	ben  parleytest.Device
	g    string
}

// withdrawals are the changes that take ben's address ("tok-ben") out of
// use: through the process without providers, a, except a new token,
// which needs a process with the provider.
var withdrawals = []struct {
	name   string
	change func(t *testing.T, w *withdrawPair, ben parleytest.Device)
}{
	{"revoke", func(t *testing.T, w *withdrawPair, ben parleytest.Device) {
		if st := w.a.Admin(t, "DELETE", "/v1/devices/"+ben.ID, nil, nil); st != http.StatusOK {
			t.Errorf("revoke: %d", st)
		}
	}},
	{"reinstall", func(t *testing.T, w *withdrawPair, ben parleytest.Device) {
		if st := w.a.Admin(t, "POST", "/v1/devices/"+ben.ID+"/reinstall", nil, nil); st != http.StatusOK {
			t.Errorf("reinstall: %d", st)
		}
	}},
	{"suspend", func(t *testing.T, w *withdrawPair, ben parleytest.Device) {
		if st := w.a.Admin(t, "POST", "/v1/users/"+ben.User+"/suspend", nil, nil); st != http.StatusOK {
			t.Errorf("suspend: %d", st)
		}
	}},
	{"unregister", func(t *testing.T, w *withdrawPair, ben parleytest.Device) {
		cb, _ := dial(t, w.a, ben)
		if _, err := cb.Do(ctx(t), wire.Request{T: wire.TNotifyUnregister}); err != nil {
			t.Errorf("notify_unregister: %v", err)
		}
		cb.Close()
	}},
	{"new token", func(t *testing.T, w *withdrawPair, ben parleytest.Device) {
		cb, _ := dial(t, w.b, ben)
		if _, err := cb.Do(ctx(t), wire.Request{T: wire.TNotifyRegister, Provider: "webhook", Token: "tok-ben-new"}); err != nil {
			t.Errorf("notify_register: %v", err)
		}
		cb.Close()
	}},
}

// TestNotifyWithdrawLeasedSends, for every change that withdraws an
// address: a notification already handed to a provider worker when the
// change is answered is not sent to the address (the only worker is busy
// with another device's request, held by the receiver); and a change
// made while a request to the address is in flight is answered only once
// that request ended.
func TestNotifyWithdrawLeasedSends(t *testing.T) {
	t.Parallel() // mostly waiting: see the Makefile's test target
	for _, c := range withdrawals {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			leasedSends(t, c.change)
		})
	}
}

func leasedSends(t *testing.T, change func(t *testing.T, w *withdrawPair, ben parleytest.Device)) {
	const delay = 300 * time.Millisecond
	w := startWithdrawPair(t, delay, 1) // one worker: a held request holds the rest
	var mu sync.Mutex
	held := map[string]chan struct{}{} // token -> closed to answer
	arrived := make(chan string, 16)
	w.s.reply = func(p notify.WebhookPayload, _ int, _ http.ResponseWriter) bool {
		mu.Lock()
		release := held[p.Token]
		mu.Unlock()
		if release != nil {
			arrived <- p.Token
			<-release
		}
		return false
	}
	hold := func(token string) chan struct{} {
		c := make(chan struct{})
		mu.Lock()
		held[token] = c
		mu.Unlock()
		return c
	}
	// oldToken: what ben's device received at its withdrawn address.
	oldToken := func(ben parleytest.Device) []notify.WebhookPayload {
		var out []notify.WebhookPayload
		for _, p := range w.s.of(ben.ID) {
			if p.Token == "tok-ben" {
				out = append(out, p)
			}
		}
		return out
	}
	ana := w.a.User(t, "ana", 1)[0]
	ben := w.a.User(t, "ben", 1)[0]
	cat := w.a.User(t, "cat", 1)[0]
	w.a.Group(t, "h", "ana", "cat")
	w.a.Group(t, "g", "ana", "ben")
	for _, d := range []parleytest.Device{ben, cat} {
		cd, _ := dial(t, w.b, d)
		register(t, cd, "webhook", "tok-"+d.User)
		cd.Close()
	}
	ca, _ := dial(t, w.b, ana)

	// Queued behind a held request: cat's notification holds the only
	// worker; ben's is prepared (its registration read) and waits for
	// the worker when ben's address is withdrawn.
	releaseCat := hold("tok-cat")
	mustSend(t, ca, "h", "c1", []byte("for cat"))
	waitArrived(t, arrived, "tok-cat")
	mustSend(t, ca, "g", "b1", []byte("for ben"))
	time.Sleep(delay + 700*time.Millisecond) // ben's notification is prepared and handed over
	change(t, w, ben)
	close(releaseCat)
	w.s.waitFor(t, cat.ID, 1)
	time.Sleep(delay + time.Second) // a nothing-more-happens check
	if got := oldToken(ben); len(got) != 0 {
		t.Fatalf("notified at the withdrawn address after the change was answered: %+v", got)
	}

	// In flight: a request to dan's address is held by the receiver when
	// it is withdrawn; the change is answered after the request ended.
	dan := w.a.User(t, "dan", 1)[0]
	w.a.Group(t, "k", "ana", "dan")
	cd, _ := dial(t, w.b, dan)
	register(t, cd, "webhook", "tok-ben") // the address ben's change withdraws
	cd.Close()
	release := hold("tok-ben")
	mustSend(t, ca, "k", "d1", []byte("for dan"))
	waitArrived(t, arrived, "tok-ben")
	answered := make(chan time.Time, 1)
	go func() {
		change(t, w, dan)
		answered <- time.Now()
	}()
	time.Sleep(300 * time.Millisecond)
	released := time.Now()
	close(release)
	select {
	case at := <-answered:
		if at.Before(released) {
			t.Fatalf("the change was answered %v before the request in flight to the address ended", released.Sub(at))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the change was not answered")
	}
}

func waitArrived(t *testing.T, arrived chan string, token string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got := <-arrived:
			if got == token {
				return
			}
		case <-timeout:
			t.Fatalf("no request for %s reached the receiver", token)
		}
	}
}
