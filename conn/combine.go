package conn

import (
	"context"

	"github.com/parley-im/parley/fanout"
	"github.com/parley-im/parley/internal/batch"
	"github.com/parley-im/parley/route"
	"github.com/parley-im/parley/store"
)

// Combined reads of the gateway.
const (
	// snapshotBatchItems is the most conversations one snapshot statement
	// covers (a lone request of up to maxSnapshot always runs).
	snapshotBatchItems = 2000
	// memberLoadMax is the most conversations one member-list read
	// covers (typing and receipts).
	memberLoadMax = 1000
	// authBatch is the most devices one auth lookup reads.
	authBatch = 256
	// disconnectBatch is the most closed connections one pair of Redis
	// pipelines removes.
	disconnectBatch = 1000
	// receiptBatch is the most receipts one gate pipeline covers.
	receiptBatch = 1000
	// combineWorkers is how many statements of each kind may run at once.
	combineWorkers = 4
	// provisionWorkers is how many provisioning statements (first JWT
	// logins) may run at once: each is a write transaction whose commit
	// waits for the WAL flush, so fewer, bigger batches cost PostgreSQL
	// less than many small ones, and one batch gathers the first logins
	// that arrive while the other commits.
	provisionWorkers = 2
)

// deviceLookup is the answer to one auth's device lookup.
type deviceLookup struct {
	dev   store.Device
	found bool
}

func (g *Gateway) initCombiners() {
	g.snapshots = batch.Combiner[store.SnapshotQuery, []store.SnapshotItem]{
		Workers: combineWorkers, Max: snapshotBatchItems, Timeout: g.cfg.RequestTimeout, Log: g.log, Go: g.goroutine,
		Weight: func(q store.SnapshotQuery) int { return len(q.Convs) },
		Run: func(ctx context.Context, qs []store.SnapshotQuery) ([][]store.SnapshotItem, error) {
			return g.deps.Store.SnapshotBatch(ctx, qs, g.cfg.SnapshotFullMax, g.cfg.SnapshotTail)
		},
		Sizes: g.metrics.combined.WithLabelValues("snapshot"),
	}
	g.lookups = batch.Combiner[string, deviceLookup]{
		Workers: combineWorkers, Max: authBatch, Timeout: g.cfg.RequestTimeout, Log: g.log, Go: g.goroutine,
		Run:   g.lookupDevices,
		Sizes: g.metrics.combined.WithLabelValues("auth"),
	}
	g.provisions = batch.Combiner[store.NewLogin, deviceLookup]{
		Workers: provisionWorkers, Max: authBatch, Timeout: g.cfg.RequestTimeout, Log: g.log, Go: g.goroutine,
		Run: func(ctx context.Context, ls []store.NewLogin) ([]deviceLookup, error) {
			if err := g.deps.Store.ProvisionDevices(ctx, ls); err != nil {
				return nil, err
			}
			ids := make([]string, len(ls))
			for i, l := range ls {
				ids[i] = l.Device
			}
			return g.lookupDevices(ctx, ids)
		},
		Sizes: g.metrics.combined.WithLabelValues("provision"),
	}
	g.members.loads = batch.Combiner[string, []string]{
		Workers: combineWorkers, Max: memberLoadMax, Timeout: g.cfg.RequestTimeout, Log: g.log, Go: g.goroutine,
		Run: func(ctx context.Context, convs []string) ([][]string, error) {
			return g.members.read(ctx, g.deps.Store, convs)
		},
		Sizes: g.metrics.combined.WithLabelValues("members"),
	}
	// Each auth joins the online index of its user's big conversations:
	// a statement and a pipeline per batch, not per device (in a
	// reconnect storm, a query each queued behind the snapshot batches
	// for the pool's connections, and auths waited seconds).
	g.onlines = batch.Combiner[fanout.OnlineDevice, struct{}]{
		Workers: combineWorkers, Max: authBatch, Timeout: g.cfg.RequestTimeout, Log: g.log, Go: g.goroutine,
		Run: func(ctx context.Context, devs []fanout.OnlineDevice) ([]struct{}, error) {
			return make([]struct{}, len(devs)), g.deps.Online(ctx, devs)
		},
		Sizes: g.metrics.combined.WithLabelValues("online"),
	}
	// Each auth registers its connection in the route table: a pipeline
	// per batch, not a round trip per device. The batch's users are then
	// announced to every gateway in one bus message (Deps.Announce), so
	// that typing and receipts relayed anywhere reach the new
	// connections from their auth_ok on; a lost announcement costs only
	// that, so it fails no auth.
	g.registers = batch.Combiner[route.Registration, route.Registered]{
		Workers: combineWorkers, Max: authBatch, Timeout: g.cfg.RequestTimeout, Log: g.log, Go: g.goroutine,
		Run: func(ctx context.Context, rs []route.Registration) ([]route.Registered, error) {
			out := g.deps.Routes.RegisterMany(ctx, rs)
			if g.deps.Announce != nil {
				users := make([]string, 0, len(rs))
				seen := make(map[string]bool, len(rs))
				for i, r := range rs {
					if out[i].Err == nil && !seen[r.User] {
						seen[r.User] = true
						users = append(users, r.User)
					}
				}
				if err := g.deps.Announce(ctx, users); err != nil {
					g.log.Debug("announcing new connections", "users", len(users), "err", err)
				}
			}
			return out, nil
		},
		Sizes: g.metrics.combined.WithLabelValues("register"),
	}
	// Each closed connection leaves the route table and the online index:
	// after a network blip or a gateway restart thousands close at once.
	g.disconnects = batch.Combiner[route.Disconnected, struct{}]{
		Workers: combineWorkers, Max: disconnectBatch, Timeout: g.cfg.RequestTimeout, Log: g.log, Go: g.goroutine,
		Run: func(ctx context.Context, cs []route.Disconnected) ([]struct{}, error) {
			return make([]struct{}, len(cs)), g.deps.Routes.Disconnect(ctx, cs)
		},
		Sizes: g.metrics.combined.WithLabelValues("disconnect"),
	}
}

// lookupDevices reads the devices ids, in one statement: one answer per
// id, in order.
func (g *Gateway) lookupDevices(ctx context.Context, ids []string) ([]deviceLookup, error) {
	devs, err := g.deps.Store.DevicesByID(ctx, ids)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]store.Device, len(devs))
	for _, d := range devs {
		byID[d.ID] = d
	}
	out := make([]deviceLookup, len(ids))
	for i, id := range ids {
		out[i].dev, out[i].found = byID[id]
	}
	return out, nil
}
