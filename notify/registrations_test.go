package notify

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/test/testenv"
)

// TestConfigErrorKeepsRegistrations: APNs answering
// DeviceTokenNotForTopic (a wrong apns_topic) drops the notification,
// counts it under reason config and keeps the registration.
func TestConfigErrorKeepsRegistrations(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "apns")
	a, fake, _ := newAPNsPair(t)
	tok := fake.device("ben-phone", "im.other.app")
	ctx := context.Background()
	if _, err := w.st.RegisterNotify(ctx, store.Registration{Device: "ben-d", User: "ben", Provider: "apns", Token: tok,
		RegisteredAt: time.Now().UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	n := w.notifier(t, reg, a)
	n.Start()
	n.Committed([]eventlog.Committed{w.send(t, 2)})
	testenv.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if d := counter(t, reg, "parley_notify_dropped_total"); d != 1 {
			return fmt.Errorf("%v dropped", d)
		}
		return nil
	})
	if fake.refusals("DeviceTokenNotForTopic") != 1 {
		t.Fatalf("refusals %v", fake.refused)
	}
	if got := labelled(t, reg, "parley_notify_dropped_total", "reason"); got != "config" {
		t.Fatalf("dropped with reason %q, want config", got)
	}
	regs, err := w.st.NotifyRegistrations(ctx, []string{"ben-d"})
	if err != nil || regs["ben-d"].Token != tok {
		t.Fatalf("registration after a configuration error: %v %v", regs, err)
	}
}

// TestGoneTokenRegisteredAgain: APNs's 410 removes the registration only
// if the device registered its token before Apple's timestamp.
func TestGoneTokenRegisteredAgain(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "apns")
	a, fake, _ := newAPNsPair(t)
	tok := fake.device("ben-phone", "im.parley.app")
	since := time.Now().Add(-time.Hour).UnixMilli()
	fake.setDevice(tok, func(d *apnsDevice) { d.goneAt = since })
	ctx := context.Background()
	register := func(at int64) {
		if _, err := w.st.RegisterNotify(ctx, store.Registration{Device: "ben-d", User: "ben", Provider: "apns", Token: tok, RegisteredAt: at}); err != nil {
			t.Fatal(err)
		}
	}
	register(time.Now().UnixMilli()) // after Apple's timestamp: the app has the token again
	reg := prometheus.NewRegistry()
	n := w.notifier(t, reg, a)
	n.Start()
	n.Committed([]eventlog.Committed{w.send(t, 2)})
	testenv.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if d := counter(t, reg, "parley_notify_dropped_total"); d != 1 {
			return fmt.Errorf("%v dropped", d)
		}
		return nil
	})
	if regs, err := w.st.NotifyRegistrations(ctx, []string{"ben-d"}); err != nil || regs["ben-d"].Token != tok {
		t.Fatalf("a token registered after Apple's 410 timestamp was removed: %v %v", regs, err)
	}
	register(since - 1000) // before it: gone
	n.Committed([]eventlog.Committed{w.send(t, 3)})
	testenv.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		regs, err := w.st.NotifyRegistrations(ctx, []string{"ben-d"})
		if err != nil || len(regs) != 0 {
			return fmt.Errorf("registration %v %v", regs, err)
		}
		return nil
	})
}

// labelled is the label value of the only series of a metric.
func labelled(t *testing.T, reg *prometheus.Registry, name, label string) string {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					return l.GetValue()
				}
			}
		}
	}
	return ""
}
