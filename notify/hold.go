package notify

import "sync"

// Hold keeps the shard loops from claiming jobs until release is called
// (a look already under way finishes). Jobs are still queued and fall
// due as always; once released, every loop claims what is due. For tests
// that need a condition to settle (acks committed) before notify_delay
// matters, whatever the host's speed: evaluation and sending then run as
// they always do. One hold at a time; release may be called more than
// once.
func (n *Notifier) Hold() (release func()) {
	h := make(chan struct{})
	n.held.Store(&h)
	return sync.OnceFunc(func() {
		n.held.CompareAndSwap(&h, nil)
		close(h)
	})
}

// waitHeld waits while a Hold is in force; false if the notifier stopped
// meanwhile.
func (n *Notifier) waitHeld() bool {
	h := n.held.Load()
	if h == nil {
		return true
	}
	select {
	case <-*h:
		return true
	case <-n.stop:
		return false
	}
}
