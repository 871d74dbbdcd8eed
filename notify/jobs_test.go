package notify

import (
	"fmt"
	"testing"
	"time"
)

// The messages of an intake round share jobs, but only within their
// conversation's shard (whose loop evaluates them in commit order, so a
// later job never overtakes an earlier one's messages of the same
// conversation), at most eventsPerJob to a job, each job due notify_delay
// after its newest commit.
func TestMessageJobs(t *testing.T) {
	t.Parallel()
	n := &Notifier{cfg: Config{Shards: 4, Delay: 2 * time.Second}, q: newQueue(nil, "p:", 4)}
	var msgs []eventRef
	var ts []int64
	for i := range 1000 {
		ts = append(ts, int64(5000+i%13))
		msgs = append(msgs, eventRef{Conv: fmt.Sprint("c", i%7), Seq: int64(10 + i), Members: 2, ts: ts[i]})
	}
	jobs := n.messageJobs(nil, msgs)
	seen := map[int64]bool{}
	last := map[string]int64{} // conv → the last seq seen, in job order
	for _, j := range jobs {
		evs := j.Body.Events
		if len(evs) == 0 || len(evs) > eventsPerJob || j.Body.Kind != KindMsg {
			t.Fatalf("job %s holds %d events (kind %q)", j.ID, len(evs), j.Body.Kind)
		}
		if want := fmt.Sprintf("e|%d|%s", evs[0].Seq, evs[0].Conv); j.ID != want || j.Seq != evs[0].Seq {
			t.Errorf("job %s (seq %d), want %s", j.ID, j.Seq, want)
		}
		var newest int64
		for _, e := range evs {
			if n.q.shardOf(e.Conv) != j.Shard {
				t.Errorf("%s/%d in a job of shard %d, not its own %d", e.Conv, e.Seq, j.Shard, n.q.shardOf(e.Conv))
			}
			if e.Seq <= last[e.Conv] || seen[e.Seq] {
				t.Errorf("%s/%d out of order or twice", e.Conv, e.Seq)
			}
			last[e.Conv], seen[e.Seq] = e.Seq, true
			newest = max(newest, ts[e.Seq-10])
		}
		if j.Ts != newest || j.Due != newest+2000 {
			t.Errorf("job %s: ts %d due %d, newest commit %d", j.ID, j.Ts, j.Due, newest)
		}
	}
	if len(seen) != len(msgs) {
		t.Fatalf("%d of %d messages in jobs", len(seen), len(msgs))
	}
}
