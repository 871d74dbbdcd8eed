package route

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/scripts"
)

// The online index of a big conversation (online and pull tiers, seed
// 003): one hash per conversation, key online:{conv}, field a device id,
// value "token|gateway|boot|from_seq|user" for each connected device of
// a current member. Fan-out reads it instead of scanning every member per
// message. Gateways add a device's entries when it authenticates and
// remove them (if still theirs, by fencing token) when it closes; fan-out
// adds entries when an online user joins and removes them when one leaves.
// A per-device set, online-convs:{device}, lists the conversations a
// device was added to, so closing finds them all.
//
// Entries of a gateway whose lease is gone are ignored and reaped, like
// routes. from_seq is the start of the member's current period: an event
// below it is never pushed to the device (membership periods bound what
// a user receives).

func (t *Table) onlineKey(conv string) string { return t.prefix + "online:{" + conv + "}" }
func (t *Table) onlineConvsKey(device string) string {
	return t.prefix + "online-convs:{" + device + "}"
}

// OnlineEntry is one device's entry in one conversation's online index.
type OnlineEntry struct {
	Conv string
	Entry
	FromSeq int64
}

// AddOnlineEntries writes entries (of any gateway: fan-out adds the
// devices of a user who joined, wherever they are connected).
func (t *Table) AddOnlineEntries(ctx context.Context, es []OnlineEntry) error {
	if len(es) == 0 {
		return nil
	}
	_, err := t.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, e := range es {
			val := strconv.FormatInt(e.Token, 10) + "|" + e.Gateway + "|" + e.Boot + "|" + strconv.FormatInt(e.FromSeq, 10) + "|" + e.User
			p.HSet(ctx, t.onlineKey(e.Conv), e.Device, val)
			p.SAdd(ctx, t.onlineConvsKey(e.Device), e.Conv)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("route: online index: %w", err)
	}
	return nil
}

// Disconnected is a connection that closed: its route and its entries in
// the online index go, each only if it still belongs to Token.
type Disconnected struct {
	User, Device string
	Token        int64
}

// Disconnect removes the routes and online index entries of closed
// connections: two pipelines for all of them (after a network blip or a
// gateway's restart thousands close at once, and a round trip or two
// each took a good share of the gateway's CPU in a reconnect storm:
// BENCHMARKS.md, the row "acf5b32 against f3921e7").
func (t *Table) Disconnect(ctx context.Context, cs []Disconnected) error {
	convs := make([]*redis.StringSliceCmd, len(cs))
	_, err := scripts.RunPipelined(ctx, t.rdb, func(p redis.Pipeliner) {
		for i, c := range cs {
			scripts.RouteDel.EvalSha(ctx, p, []string{t.userKey(c.User)}, c.Device, strconv.FormatInt(c.Token, 10))
			convs[i] = p.SMembers(ctx, t.onlineConvsKey(c.Device))
		}
	})
	if err != nil {
		return fmt.Errorf("route: %w", err)
	}
	var es []OnlineEntry
	for i, c := range cs {
		for _, conv := range convs[i].Val() {
			es = append(es, OnlineEntry{Conv: conv, Entry: Entry{Device: c.Device, Token: c.Token}})
		}
	}
	return t.RemoveOnlineEntries(ctx, es)
}

// RemoveOnlineEntries removes entries, each only if its token still
// matches (a newer connection of the device keeps its own).
func (t *Table) RemoveOnlineEntries(ctx context.Context, es []OnlineEntry) error {
	if len(es) == 0 {
		return nil
	}
	_, err := scripts.RunPipelined(ctx, t.rdb, func(p redis.Pipeliner) {
		for _, e := range es {
			scripts.RouteDel.EvalSha(ctx, p, []string{t.onlineKey(e.Conv)}, e.Device, strconv.FormatInt(e.Token, 10))
		}
	})
	if err != nil {
		return fmt.Errorf("route: online index: %w", err)
	}
	return nil
}

// Online returns the live entries of conv's online index.
func (t *Table) Online(ctx context.Context, conv string) ([]OnlineEntry, error) {
	m, err := t.rdb.HGetAll(ctx, t.onlineKey(conv)).Result()
	if err != nil {
		return nil, fmt.Errorf("route: online index: %w", err)
	}
	all := make([]OnlineEntry, 0, len(m))
	for dev, val := range m {
		parts := strings.SplitN(val, "|", 5)
		if len(parts) != 5 {
			continue
		}
		tok, err1 := strconv.ParseInt(parts[0], 10, 64)
		from, err2 := strconv.ParseInt(parts[3], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		all = append(all, OnlineEntry{Conv: conv, FromSeq: from,
			Entry: Entry{User: parts[4], Device: dev, Token: tok, Gateway: parts[1], Boot: parts[2]}})
	}
	es := make([]Entry, len(all))
	for i, e := range all {
		es[i] = e.Entry
	}
	live, err := t.filterLive(ctx, es)
	if err != nil {
		return nil, err
	}
	if len(live) == len(all) {
		return all, nil
	}
	ok := make(map[string]bool, len(live))
	for _, e := range live {
		ok[e.Device] = true
	}
	out := all[:0]
	var dead []OnlineEntry
	for _, e := range all {
		if ok[e.Device] {
			out = append(out, e)
		} else {
			dead = append(dead, e)
		}
	}
	_ = t.RemoveOnlineEntries(ctx, dead) // reap
	return out, nil
}

// DropOnline deletes conv's online index (the conversation left the big
// tiers; it is rebuilt if it comes back).
func (t *Table) DropOnline(ctx context.Context, conv string) error {
	return t.rdb.Del(ctx, t.onlineKey(conv)).Err()
}
