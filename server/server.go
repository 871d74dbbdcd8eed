// Package server assembles one parleyd process: the gateway, the
// conversation log and its group-commit workers, fan-out, the routing
// table's lease, the admin API and the metrics listener, over one
// PostgreSQL pool and one Redis client. Several processes may share the
// same PostgreSQL and Redis.
package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/admin"
	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/conn"
	"github.com/parley-im/parley/cursor"
	"github.com/parley-im/parley/eventlog"
	"github.com/parley-im/parley/fanout"
	"github.com/parley-im/parley/jwtauth"
	"github.com/parley-im/parley/notify"
	"github.com/parley-im/parley/route"
	"github.com/parley-im/parley/scripts"
	"github.com/parley-im/parley/seq"
	"github.com/parley-im/parley/store"
)

// clusterReload is how often the Redis Cluster client refreshes its slot
// map while it is in use (see New).
const clusterReload = time.Second

// clusterReloadHook asks a cluster client to reload its slot map (in the
// background; go-redis coalesces reloads) when a command or pipeline
// failed without a reply from Redis (refused, reset, timed out) or with a
// reply saying the cluster is changing (CLUSTERDOWN, TRYAGAIN, MASTERDOWN):
// a master may have died and a replica taken over.
type clusterReloadHook struct{ cc *redis.ClusterClient }

func (h clusterReloadHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h clusterReloadHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.check(err)
		return err
	}
}

func (h clusterReloadHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if h.check(c.Err()) {
				break
			}
		}
		return err
	}
}

// check reloads the slot map if err calls for it, and reports whether it did.
func (h clusterReloadHook) check(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) {
		return false
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		if !strings.HasPrefix(msg, "CLUSTERDOWN") && !strings.HasPrefix(msg, "TRYAGAIN") && !strings.HasPrefix(msg, "MASTERDOWN") {
			return false // a reply from a node that is up
		}
	}
	h.cc.ReloadState(context.Background())
	return true
}

// newRedis returns a client of cfg's Redis (its cluster when
// redis_cluster is set) with pool connections per node.
func newRedis(cfg config.Config, pool int) (redis.UniversalClient, error) {
	// A request waiting on a Redis that is down should fail with
	// UNAVAILABLE within a fraction of a second, not after go-redis's
	// default budget of 3 retries × 5 dial attempts (about 2.5 s).
	const maxRetries, dialerRetries = 1, 2
	if cfg.RedisCluster != "" {
		// go-redis learns of a failover from a MOVED reply, which a dead
		// master never sends: until its periodic reload of the slot map
		// (default every 60 s) it keeps dialling the dead node. Reload it
		// every second instead (one CLUSTER SLOTS, only while commands
		// flow), and at once when a command fails on a node that did not
		// answer (clusterReloadHook), so a promoted replica is used soon
		// after the cluster elected it.
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(cfg.RedisCluster, ","),
			PoolSize: pool, MaxRetries: maxRetries, DialerRetries: dialerRetries, ClusterStateReloadInterval: clusterReload,
			DisableIdentity: true})
		cc.AddHook(clusterReloadHook{cc})
		return cc, nil
	}
	opt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("redis_url: %w", err)
	}
	opt.PoolSize = max(opt.PoolSize, pool)
	opt.MaxRetries, opt.DialerRetries = maxRetries, dialerRetries
	opt.DisableIdentity = true // CLIENT SETINFO: Redis before 7.2 refuses it (an error per new connection)
	return redis.NewClient(opt), nil
}

// Server is one parleyd process.
type Server struct {
	// Static after New.
	cfg config.Config
	log *slog.Logger
	reg *prometheus.Registry
	st  *store.Store
	rdb redis.UniversalClient
	// notifyRdb is the notifier's own client (a pool apart from rdb's).
	notifyRdb redis.UniversalClient
	routes    *route.Table
	events    *eventlog.Log
	cursors   *cursor.Cursors
	fan       *fanout.Fanout
	rows      *fanout.Rows
	bus       *fanout.Bus
	notify    *notify.Notifier
	gw        *conn.Gateway
	adminLn   net.Listener
	metrLn    net.Listener
	ps        *redis.PubSub
	// background ends the JWKS refresh and the lifecycle reader
	// (stopBackground, at Shutdown).
	background     context.Context
	stopBackground context.CancelFunc
	// lifecycleFrom: the lifecycle notice to read after (those before
	// were announced before this process started).
	lifecycleFrom string
	// Removal notices from the bus (storeMetrics.removalNotices).
	removalNotices prometheus.Counter

	httpServers []*http.Server
	wg          sync.WaitGroup
	// readers: goroutines that block in Redis reads (the lifecycle
	// stream) and touch nothing Shutdown closes before the Redis client;
	// it waits for them after closing the client, which ends their reads.
	readers sync.WaitGroup
	stop    chan struct{}
	gwErr   chan error
	once    sync.Once
}

// New connects to PostgreSQL (applying migrations unless cfg.Migrate is
// false) and Redis, loads the scripts, and binds the admin and metrics
// listeners. Start serves.
func New(ctx context.Context, cfg config.Config, log *slog.Logger) (_ *Server, err error) {
	s := &Server{cfg: cfg, log: log, reg: prometheus.NewRegistry(), stop: make(chan struct{}), gwErr: make(chan error, 1)}
	// The JWKS refresh (if any) and the lifecycle reader live until Shutdown.
	s.background, s.stopBackground = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			s.stopBackground()
			s.closeStores()
		}
	}()
	if s.cfg.AdminToken == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		s.cfg.AdminToken = hex.EncodeToString(b[:])
	}
	if s.cfg.GatewayID == "" {
		host, _ := os.Hostname()
		_, port, _ := net.SplitHostPort(cfg.Listen)
		s.cfg.GatewayID = strings.ReplaceAll(host+":"+port, "|", "_")
	}
	if s.st, err = store.Open(ctx, cfg.PostgresURL, cfg.PostgresMaxConns); err != nil {
		return nil, err
	}
	if cfg.Migrate {
		if err = s.st.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	if err = s.st.PlanSnapshots(ctx); err != nil {
		// Each connection then plans it at its first snapshot.
		log.Warn("planning the snapshot statement", "err", err)
	}
	if s.rdb, err = newRedis(cfg, 64); err != nil {
		return nil, err
	}
	// Notifications have a client (a connection pool) of their own: their
	// workers never take connections the send path is waiting for, and
	// their traffic during a Redis outage leaves its pool alone.
	if s.notifyRdb, err = newRedis(cfg, 16); err != nil {
		return nil, err
	}
	sm := newStoreMetrics(s.reg)
	s.removalNotices = sm.removalNotices
	s.rdb.AddHook(redisErrorHook{sm.redisErrors})
	if err = s.rdb.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	if err = scripts.Load(ctx, s.rdb); err != nil {
		return nil, fmt.Errorf("loading scripts: %w", err)
	}

	var boot [8]byte
	_, _ = rand.Read(boot[:])
	s.routes = route.New(s.rdb, cfg.RedisPrefix, s.cfg.GatewayID, hex.EncodeToString(boot[:]), cfg.GatewayLease)
	if err = s.routes.RenewLease(ctx); err != nil {
		return nil, fmt.Errorf("gateway lease: %w", err)
	}
	s.bus = fanout.NewBus(s.rdb, cfg.RedisPrefix, s.cfg.GatewayID)
	seqs := seq.New(s.rdb, cfg.RedisPrefix, s.st.Heads)
	// Acks are many and small: few workers and a long linger make big
	// batches, so they cost few commits (WAL flushes) and leave the CPU to
	// sends.
	s.cursors = cursor.New(s.st, s.rdb, cfg.RedisPrefix, log, cursor.Config{
		AckWorkers: cfg.AckWorkers, AckLinger: cfg.AckLinger, ReadWorkers: max(1, cfg.CommitWorkers/2), MaxBatch: cfg.CommitBatch,
		Timeout: cfg.RequestTimeout, Acks: sm.commitMetrics("ack"), Reads: sm.commitMetrics("read")})
	// Fan-out takes the log's commits and the gateway's logins; it
	// delivers to the gateway once that exists (Start).
	s.rows = fanout.NewRows(s.rdb, cfg.RedisPrefix, s.cfg.GatewayID+"-"+s.routes.Boot(),
		fanout.RowsConfig{Workers: cfg.FanoutWorkers, ClaimIdle: cfg.FanoutClaimIdle, Timeout: cfg.RequestTimeout}, log, s.reg)
	s.fan = fanout.New(s.st, s.routes, s.bus, s.rows, fanout.Config{WriteMax: cfg.WriteFanoutMax, OnlineMax: cfg.OnlineFanoutMax,
		Workers: 4, AckFlush: cfg.AckCoalesce, Timeout: cfg.RequestTimeout}, log, s.reg)
	providers, err := notify.Providers(cfg, notify.HTTPClient(cfg))
	if err != nil {
		return nil, err
	}
	s.notify = notify.New(s.st, s.notifyRdb, notify.ConfigOf(s.cfg), providers, s.connectedDevices, log, s.reg)
	sends := sm.commitMetrics("send")
	s.events = eventlog.New(s.st, seqs, eventlog.Config{HoleTimeout: cfg.HoleTimeout, CommitBatch: cfg.CommitBatch, CommitWorkers: cfg.CommitWorkers, CommitLinger: cfg.CommitLinger,
		Timeout: cfg.RequestTimeout, RecipientsBelow: cfg.WriteFanoutMax, BatchSizes: sends.Sizes,
		Stages: eventlog.Stages{Queue: sends.Queue, Resends: sm.stages.WithLabelValues("send", "resends"), Seq: sends.Redis, Insert: sends.Postgres},
		MemberLookups: eventlog.MemberLookups{Waited: sm.memberLookups.WithLabelValues("send"),
			Refreshed: sm.memberLookups.WithLabelValues("refresh")},
		BeforeLeave: s.fan.BeforeLeave,
		// This gateway's member lists are dropped at once, the others'
		// by the bus.
		Removed: func(ctx context.Context, conv string, users []string) error {
			s.gw.ForgetMembers(conv)
			return s.bus.Removed(ctx, conv, users)
		},
		Joined: func(ctx context.Context, convs []string) error {
			for _, c := range convs {
				s.gw.ForgetMembers(c)
			}
			return s.bus.Joined(ctx, convs)
		}},
		log, func(evs []eventlog.Committed) {
			s.fan.Enqueue(evs)
			s.notify.Committed(evs)
		})
	verifier, err := jwtauth.New(s.background, jwtauth.Config{HMACSecret: cfg.JWTHMACSecret, PublicKeyFile: cfg.JWTPublicKeyFile,
		JWKSURL: cfg.JWTJWKSURL, Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience, DeviceClaim: cfg.JWTDeviceClaim})
	if err != nil {
		return nil, err
	}
	s.gw = conn.New(s.cfg, conn.Deps{JWT: verifier, Store: s.st, Log: s.events, Cursors: s.cursors, Routes: s.routes, Bus: s.bus, Rows: s.rows,
		Mentions: conn.NewMentionLimiter(s.rdb, cfg.RedisPrefix, cfg.MentionAllRate, cfg.MentionAllPeriod),
		Online:   s.fan.Online, ToUser: s.fan.ToUser, ToUsers: s.fan.ToUsers, RoutesChanged: s.fan.RoutesChanged, Announce: s.fan.Announce, Receipts: conn.NewReceiptGate(s.rdb, cfg.RedisPrefix),
		Notifications: s.notify}, log, s.reg)
	s.fan.Start(s.gw)
	if s.ps, err = s.bus.Subscribe(ctx); err != nil {
		return nil, err
	}
	if s.lifecycleFrom, err = s.bus.LifecycleFrom(ctx); err != nil {
		return nil, err
	}

	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if s.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
		return nil, fmt.Errorf("admin_listen: %w", err)
	}
	if cfg.MetricsListen != "" {
		if s.metrLn, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			s.adminLn.Close()
			return nil, fmt.Errorf("metrics_listen: %w", err)
		}
	}
	return s, nil
}

// connectedDevices returns which devices of users have a live connection
// on any gateway (the routing table).
func (s *Server) connectedDevices(ctx context.Context, users []string) (map[string]bool, error) {
	entries, err := s.routes.Lookup(ctx, users)
	if err != nil {
		return nil, err
	}
	on := make(map[string]bool, len(entries))
	for _, e := range entries {
		on[e.Device] = true
	}
	return on, nil
}

// Config is the effective configuration (with generated values filled in).
func (s *Server) Config() config.Config { return s.cfg }

// AdminAddr is the admin API's bound address.
func (s *Server) AdminAddr() string { return s.adminLn.Addr().String() }

// MetricsAddr is the metrics listener's bound address ("" if disabled).
func (s *Server) MetricsAddr() string {
	if s.metrLn == nil {
		return ""
	}
	return s.metrLn.Addr().String()
}

// Start serves the gateway, the admin API and metrics, and keeps the
// gateway's lease. It returns once the gateway accepts connections.
func (s *Server) Start(ctx context.Context) error {
	s.goroutine(func() { s.gwErr <- s.gw.Run() })
	s.goroutine(func() {
		fanout.Serve(s.ps, s.gw, fanout.Handlers{Kick: s.gw.Kick, Joined: s.gw.ForgetMembers, Moved: s.fan.RoutesMoved,
			Removed: func(r fanout.Removal) {
				s.events.Forget(r.Conv, r.Users)
				s.gw.ForgetMembers(r.Conv)
				s.removalNotices.Inc()
			}})
	})
	s.readers.Add(1)
	go func() {
		defer s.readers.Done()
		s.bus.FollowLifecycle(s.background, s.lifecycleFrom, s.gw.Lifecycle)
	}()
	s.goroutine(s.keepLease)
	if err := s.rows.Start(ctx); err != nil {
		return err
	}
	s.notify.Start()

	mode := func(n int64) string { return fanout.TierOf(n, s.cfg.WriteFanoutMax, s.cfg.OnlineFanoutMax).String() }
	userDevices := func(ctx context.Context, user string) (map[string]bool, error) {
		return s.connectedDevices(ctx, []string{user})
	}
	api := admin.New(s.cfg.AdminToken, s.st, s.events, s.cursors, mode, s.bus.Lifecycle, s.notify.Withdraw, userDevices, s.log)
	api.Connected(func(ctx context.Context, user, device string) (bool, error) {
		on, err := s.connectedDevices(ctx, []string{user})
		return on[device], err
	})
	s.serveHTTP(s.adminLn, api)
	if s.metrLn != nil {
		s.serveHTTP(s.metrLn, s.metricsMux())
	}
	select {
	case <-s.gw.Booted():
		return nil
	case err := <-s.gwErr:
		return fmt.Errorf("gateway: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Server) serveHTTP(ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	s.httpServers = append(s.httpServers, srv)
	s.goroutine(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http server", "addr", ln.Addr().String(), "err", err)
		}
	})
}

func (s *Server) metricsMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := s.Ready(ctx); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Ready reports whether the gateway accepts connections, both stores
// answer and the Redis scripts are loaded.
func (s *Server) Ready(ctx context.Context) error {
	select {
	case <-s.gw.Booted():
	default:
		return errors.New("gateway not listening yet")
	}
	if err := s.st.Ping(ctx); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	loaded, err := scripts.Loaded(ctx, s.rdb)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if !loaded {
		// A Redis that restarted empty: load them again (readiness must not
		// wait for the first NOSCRIPT).
		if err := scripts.Load(ctx, s.rdb); err != nil {
			return fmt.Errorf("redis scripts: %w", err)
		}
	}
	return nil
}

// keepLease renews the gateway's lease every gateway_lease/3.
func (s *Server) keepLease() {
	t := time.NewTicker(s.cfg.GatewayLease / 3)
	defer t.Stop()
	again := 0 // ticks left on which to re-register once more
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.GatewayLease/3)
			lost, err := s.routes.RenewLeaseCheck(ctx)
			if err != nil {
				s.log.Warn("renewing gateway lease", "err", err)
			} else if lost {
				// Redis lost the lease (flushed, restarted empty, or a failover
				// outlasted it): other gateways may have reaped our routing
				// entries, or Redis lost them too. Re-register every
				// connection with its own token, so a newer connection
				// elsewhere still wins.
				again = 2
				if s.gw.Reregister(ctx) != nil {
					again = 3 // some failed: keep trying on the next ticks
				}
			} else if again > 0 {
				// And on the next two ticks: a gateway that read our lease
				// just before the renewal may reap an entry right after it
				// was re-registered, and on a cluster a re-registration can
				// be cut short by a shard still failing over.
				again--
				if s.gw.Reregister(ctx) != nil {
					again = max(again, 1)
				}
			}
			cancel()
		}
	}
}

func (s *Server) goroutine(f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

// Shutdown stops accepting, kicks clients ("shutdown"), finishes queued
// commits and fan-out, and closes the stores. Safe to call twice.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		close(s.stop)
		s.stopBackground()
		err = s.gw.Shutdown(ctx)
		for _, srv := range s.httpServers {
			_ = srv.Shutdown(ctx)
		}
		s.events.Close()
		s.cursors.Close()
		s.fan.Close()
		s.rows.Close()
		s.notify.Close()
		_ = s.ps.Close()
		dctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.routes.DropLease(dctx)
		cancel()
		s.wg.Wait()
		s.closeStores()
		// Reads blocked in Redis end with the client.
		s.readers.Wait()
		s.rows.Wait()
	})
	return err
}

func (s *Server) closeStores() {
	if s.rdb != nil {
		_ = s.rdb.Close()
	}
	if s.notifyRdb != nil {
		_ = s.notifyRdb.Close()
	}
	if s.st != nil {
		s.st.Close()
	}
}
