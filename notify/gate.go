package notify

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/internal/backend"
	"github.com/parley-im/parley/scripts"
)

// A device's notification address can be withdrawn: the device revoked
// or reinstalled, its registration removed or given another token, its
// user suspended. Once the request that withdraws it is answered, no
// provider may be sent anything for that address, on any process,
// whatever was queued, collapsed, claimed or handed to a provider worker
// before (docs/notifications.md, "Withdrawing an address").
//
// PostgreSQL holds the registrations, and dispatch reads them just
// before a notification is handed to its provider's workers; what it read
// may be withdrawn while the notification waits for a worker. Each
// device therefore has a gate in Redis, under its own hash tag:
//
//   - a fence, a counter that every withdrawal moves after its change is
//     committed (notify_fence);
//   - the sends in flight, each marked with an expiry.
//
// Dispatch reads the devices' fences before it reads their registrations.
// A worker enters the gate (notify_gate) just before its request: only if
// the fence has not moved since, and then the send is marked in flight
// until its outcome is recorded. A withdrawal moves the fence, then waits
// until no send is in flight. Either a worker entered before the fence
// moved (the withdrawal waits for its request), or it finds the fence
// moved and puts the notification back, to be prepared again from the
// registration as it is now (none, or the new token); and a dispatch that
// read the fence after it moved read the registration after the change
// was committed.

// errWithdrawn is the outcome of a send that found its device's fence moved.
var errWithdrawn = errors.New("notify: the device's address was withdrawn or replaced")

// fenceKey and inFlightKey are the keys of device's gate.
func (n *Notifier) fenceKey(device string) string {
	return n.cfg.Prefix + "notify:{d" + device + "}:fence"
}
func (n *Notifier) inFlightKey(device string) string {
	return n.cfg.Prefix + "notify:{d" + device + "}:sending"
}

// markLife is how long a send stays marked in flight when its worker
// never records its outcome (it died): longer than one provider request.
func (n *Notifier) markLife() time.Duration { return n.cfg.Timeout + 2*time.Second }

// fences reads the fences of devices (missing: "0"), before their
// registrations are read.
func (n *Notifier) fences(ctx context.Context, devices []string) (map[string]string, error) {
	cmds := make([]*redis.StringCmd, len(devices))
	_, err := n.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, d := range devices {
			cmds[i] = p.Get(ctx, n.fenceKey(d))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	out := make(map[string]string, len(devices))
	for i, c := range cmds {
		v, err := c.Result()
		switch {
		case errors.Is(err, redis.Nil):
			v = "0"
		case err != nil:
			return nil, err
		}
		out[devices[i]] = v
	}
	return out, nil
}

// enter passes the gate of t's device for one send, or reports
// errWithdrawn.
func (n *Notifier) enter(ctx context.Context, t *sendAttempt) error {
	ok, err := scripts.NotifyGate.Run(ctx, n.rdb, []string{n.fenceKey(t.n.Device), n.inFlightKey(t.n.Device)},
		t.fence, t.sendID, n.markLife().Milliseconds()).Int()
	if err != nil {
		return err
	}
	if ok == 0 {
		return errWithdrawn
	}
	return nil
}

// newSendID names one attempt at a send in its device's gate.
func (n *Notifier) newSendID() string {
	return n.boot + strconv.FormatUint(n.sends.Add(1), 36)
}

func newBootID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:]) + "-"
}

// leave removes the in-flight marks of sends whose outcomes are being
// recorded (in the recording pipeline p).
func (n *Notifier) leave(ctx context.Context, p redis.Pipeliner, rs []providerAnswer) {
	for _, r := range rs {
		if r.sendID != "" {
			p.ZRem(ctx, n.inFlightKey(r.device), r.sendID)
		}
	}
}

// withdrawPoll is how often a withdrawal looks whether the sends in
// flight to its devices have finished.
const withdrawPoll = 5 * time.Millisecond

// Withdraw takes the notification addresses of devices out of use, after
// the change that withdraws them (a revocation, a reinstall, a removed or
// replaced registration, a suspension) was committed in PostgreSQL: when
// it returns nil, nothing more is sent to those addresses by any
// process. It moves the devices' fences, then waits for the sends that
// passed their gates before to finish (at most a provider request's
// timeout and a little more, if their worker died mid-request). An error
// (Redis unreachable, or the sends in flight outlasting the wait) means
// the withdrawal is not complete: the caller answers UNAVAILABLE, and a
// retry of the same request withdraws again. It works whether or not this
// process has providers: another process may.
func (n *Notifier) Withdraw(ctx context.Context, devices []string) error {
	if len(devices) == 0 {
		return nil
	}
	keep := max(n.keep(), n.markLife()).Milliseconds()
	count := func(bump string, ds []string) ([]string, error) {
		cmds := make([]*redis.Cmd, len(ds))
		_, err := scripts.RunPipelined(ctx, n.rdb, func(p redis.Pipeliner) {
			for i, d := range ds {
				cmds[i] = scripts.NotifyFence.EvalSha(ctx, p, []string{n.fenceKey(d), n.inFlightKey(d)}, bump, keep)
			}
		})
		if err != nil {
			return nil, err
		}
		var busy []string
		for i, c := range cmds {
			if v, _ := c.Int64(); v > 0 {
				busy = append(busy, ds[i])
			}
		}
		return busy, nil
	}
	busy, err := count("1", devices)
	deadline := time.Now().Add(n.markLife() + time.Second)
	for err == nil && len(busy) > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("notify: sends to %d devices still in flight after %v: %w", len(busy), n.markLife(), backend.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(withdrawPoll):
		}
		busy, err = count("0", busy)
	}
	if err != nil {
		return fmt.Errorf("notify: withdrawing %d devices' addresses: %w", len(devices), err)
	}
	return nil
}
