package fanout

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
	"github.com/vmihailenco/msgpack/v5"
)

// Bus carries deliveries and kicks between gateways: each gateway
// subscribes to its own Redis channel and is addressed by its id from the
// routing table. Messages on it are hints: one lost while a gateway
// reconnects to Redis is repaired by the clients' sync. Membership
// removals go to every gateway (a channel they all subscribe to), so
// their membership caches stop answering for the removed users at once
// rather than within the cache's lifetime (the commit checks membership
// itself either way).
type Bus struct {
	// Static after construction.
	rdb     redis.UniversalClient
	prefix  string
	gateway string
}

// envelope is one bus message.
type envelope struct {
	Deliveries []Delivery `msgpack:"d,omitempty"`
	Kick       *Target    `msgpack:"k,omitempty"`
	Removed    *Removal   `msgpack:"r,omitempty"`
	Joined     []string   `msgpack:"j,omitempty"` // conversations that gained members
	Moved      []string   `msgpack:"m,omitempty"` // users with a new connection somewhere
}

// Removal is users' removal from conversation Conv.
type Removal struct {
	Conv  string   `msgpack:"c"`
	Users []string `msgpack:"u"`
}

// NewBus returns the bus endpoint of gateway.
func NewBus(rdb redis.UniversalClient, prefix, gateway string) *Bus {
	return &Bus{rdb: rdb, prefix: prefix, gateway: gateway}
}

func (b *Bus) channel(gw string) string { return b.prefix + "bus:" + gw }

// everyone is the channel every gateway subscribes to.
func (b *Bus) everyone() string { return b.prefix + "bus-all" }

// Publish sends deliveries to gateway gw.
func (b *Bus) Publish(ctx context.Context, gw string, ds []Delivery) error {
	return b.publish(ctx, gw, envelope{Deliveries: ds})
}

// Kick asks gateway gw to close device's connection with the given token
// (a newer connection of the device registered elsewhere).
func (b *Bus) Kick(ctx context.Context, gw, device string, token int64) error {
	return b.publish(ctx, gw, envelope{Kick: &Target{Device: device, Token: token}})
}

// Removed tells every gateway that users are no longer members of conv.
func (b *Bus) Removed(ctx context.Context, conv string, users []string) error {
	return b.publishTo(ctx, b.everyone(), envelope{Removed: &Removal{Conv: conv, Users: users}})
}

// Joined tells every gateway that convs gained members (they were
// created, or users joined them), so that what it caches of their member
// lists is dropped.
func (b *Bus) Joined(ctx context.Context, convs []string) error {
	return b.publishTo(ctx, b.everyone(), envelope{Joined: convs})
}

// Moved tells every gateway that users have a connection that just
// entered the route table, so that routes they reuse for those users'
// typing and receipts are looked up again.
func (b *Bus) Moved(ctx context.Context, users []string) error {
	return b.publishTo(ctx, b.everyone(), envelope{Moved: users})
}

func (b *Bus) publish(ctx context.Context, gw string, env envelope) error {
	return b.publishTo(ctx, b.channel(gw), env)
}

func (b *Bus) publishTo(ctx context.Context, channel string, env envelope) error {
	payload, err := msgpack.Marshal(env)
	if err != nil {
		return err
	}
	if err := b.rdb.Publish(ctx, channel, payload).Err(); err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	return nil
}

// Subscribe starts listening on this gateway's channel and the channel
// of every gateway, and returns once both subscriptions are confirmed;
// Serve then handles their messages.
func (b *Bus) Subscribe(ctx context.Context) (*redis.PubSub, error) {
	ps := b.rdb.Subscribe(ctx, b.channel(b.gateway), b.everyone())
	for range 2 {
		if _, err := ps.Receive(ctx); err != nil {
			ps.Close()
			return nil, fmt.Errorf("bus: %w", err)
		}
	}
	return ps, nil
}

// Handlers are what Serve hands the bus's messages other than deliveries
// to.
type Handlers struct {
	Kick    func(Target)      // close a device's connection (replaced elsewhere)
	Removed func(Removal)     // users left a conversation, or their mute or role changed
	Joined  func(conv string) // a conversation gained members
	Moved   func([]string)    // users connected a device somewhere (nil: ignored)
}

// Serve hands the messages of ps to local (deliveries) and h until ps is
// closed.
func Serve(ps *redis.PubSub, local Local, h Handlers) {
	for m := range ps.Channel(redis.WithChannelSize(1024)) {
		var env envelope
		if err := msgpack.Unmarshal([]byte(m.Payload), &env); err != nil {
			continue
		}
		if len(env.Deliveries) > 0 {
			local.Deliver(env.Deliveries)
		}
		if env.Kick != nil {
			h.Kick(*env.Kick)
		}
		if env.Removed != nil {
			h.Removed(*env.Removed)
		}
		for _, c := range env.Joined {
			h.Joined(c)
		}
		if len(env.Moved) > 0 && h.Moved != nil {
			h.Moved(env.Moved)
		}
	}
}
