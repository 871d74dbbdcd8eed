package client

import (
	"context"

	"github.com/parley-im/parley/wire"
)

// syncWorker pulls conv page by page from after until upto == head,
// handing each page to the event loop, which applies it and says where the
// next page starts.
func (c *Client) syncWorker(conv string, gen int, after int64) {
	defer c.wg.Done()
	err := c.syncPages(conv, gen, after)
	c.log.Debug("sync done", "conv", conv, "from", after, "err", err)
	if c.isClosing() {
		return
	}
	c.in.put(syncDone{conv: conv, gen: gen, err: err})
}

func (c *Client) syncPages(conv string, gen int, after int64) error {
	stalls := 0
	for {
		r, err := c.syncOnce(conv, after)
		if err != nil {
			return err
		}
		next := make(chan int64, 1)
		c.in.put(syncPage{conv: conv, gen: gen, reply: r, next: next})
		var cur int64
		select {
		case cur = <-next:
		case <-c.closing:
			return ErrClientClosed
		}
		if cur < 0 || r.Upto >= r.Head {
			return nil // stale (reset meanwhile), or caught up
		}
		if cur > after {
			after, stalls = cur, 0
			continue
		}
		// more, but upto did not move: the next seq is allocated and not
		// committed yet. It will be committed (or declared a hole by the
		// server) shortly.
		stalls++
		if stalls > stallTries {
			return errStalled
		}
		if !c.sleep(min(stallMin<<(stalls-1), stallMax)) {
			return ErrClientClosed
		}
	}
}

func (c *Client) syncOnce(conv string, after int64) (wire.Message, error) {
	select {
	case c.syncSem <- struct{}{}:
	case <-c.closing:
		return wire.Message{}, ErrClientClosed
	}
	defer func() { <-c.syncSem }()
	conn := c.Conn()
	if conn == nil {
		return wire.Message{}, ErrNotConnected
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.opt.RequestTimeout)
	defer cancel()
	return conn.Sync(ctx, conv, after, c.opt.SyncLimit)
}
