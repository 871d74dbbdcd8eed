package conn

import (
	"testing"
	"time"
)

// The refused auths of an overload get consecutive places in line
// (one per 1/auth_rate), each spread by a jitter, capped at maxAuthRetry.
func TestAuthLimiterSpreadsRetries(t *testing.T) {
	if newAuthLimiter(0, 10) != nil {
		t.Fatal("auth_rate 0 is no limit")
	}
	var off *authLimiter
	if _, ok := off.admit(time.Now()); !ok {
		t.Fatal("no limiter refused")
	}

	const rate = 100 // one slot per 10 ms
	l := newAuthLimiter(rate, 3)
	now := time.Now()
	for i := range 3 {
		if _, ok := l.admit(now); !ok {
			t.Fatalf("auth %d of the burst refused", i)
		}
	}
	const n = 1000
	jitters := map[time.Duration]bool{}
	for i := range n {
		wait, ok := l.admit(now)
		if ok {
			t.Fatalf("refusal %d admitted", i)
		}
		slot := time.Duration(i+1) * time.Second / rate
		jitter := wait - slot
		if jitter < 0 || jitter > authJitterMin+slot/4+time.Millisecond || wait < time.Millisecond {
			t.Fatalf("refusal %d: wait %v, want its slot %v plus up to %v", i, wait, slot, authJitterMin+slot/4)
		}
		jitters[jitter.Round(time.Millisecond)] = true
	}
	if len(jitters) < 40 {
		t.Fatalf("only %d different jitters in %d refusals", len(jitters), n)
	}
	// Later, tokens are back.
	if _, ok := l.admit(now.Add(20 * time.Second)); !ok {
		t.Fatal("refused after the overload")
	}

	// A long line is capped.
	l = newAuthLimiter(1, 1)
	l.admit(now)
	for range 100 {
		if wait, _ := l.admit(now); wait > maxAuthRetry+authJitterMin+maxAuthRetry/4 {
			t.Fatalf("wait %v beyond the cap", wait)
		}
	}
}
