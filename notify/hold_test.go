package notify

import (
	"fmt"
	"testing"
	"time"

	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/test/testenv"
)

// TestHold: while held, a message's job is queued and falls due but is
// not claimed, so nothing is sent well past notify_delay (100 ms here);
// once released the notification goes out, once.
func TestHold(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "webhook")
	sink := newKeySink(t)
	n := w.notifier(t, nil, NewWebhook(sink.srv.URL, "s", sink.srv.Client()))
	release := n.Hold()
	n.Start()
	n.Committed([]eventlog.Committed{w.send(t, 2)})
	time.Sleep(time.Second) // ten times notify_delay: nothing may be sent
	if c := sink.count("ben-d:g:2"); c != 0 {
		t.Fatalf("sent %d times while held", c)
	}
	release()
	release() // a second call changes nothing
	testenv.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if c := sink.count("ben-d:g:2"); c != 1 {
			return fmt.Errorf("delivered %d times after the release", c)
		}
		return nil
	})
}
