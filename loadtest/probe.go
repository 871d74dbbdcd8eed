package loadtest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Probes measure the host beside a run, so that a slow second can be told
// apart: the server's, or the machine's. With Config.ProbePostgres a
// bare commit probe inserts one row per transaction into a table of its
// own at Config.ProbeRate, and the WAL the whole PostgreSQL cluster wrote
// during the window is read from pg_stat_wal; with Config.ProbeRedis a
// PING probe runs at the same rate. Each probe is a series of the
// timeline ("pg_commit", "redis_ping"): its latency from the intended
// time (open loop: a stall delays the probes behind it, and they count
// it), p50/p99 per second and over the window.

// probeTable is the commit probe's table, in the database of
// Config.ProbePostgres.
const probeTable = "parley_load_probe"

// WALUse is the WAL PostgreSQL wrote during the window, the whole
// cluster's (the commit probe's own rows included). Bytes is the distance
// between the WAL insert positions at the window's ends, exact; Records
// and FPI come from pg_stat_wal, which each backend adds to only when it
// reports its statistics (at most once a second), so they may be up to a
// second of work off at either end. Bytes does not come from pg_stat_wal:
// over a 10-second window that lag made bytes per send wander from run to
// run where the insert positions agreed (BENCHMARKS.md, the row
// "at 5239eb8" on pg_stat_wal against the insert positions).
type WALUse struct {
	Records        int64    `json:"records"`
	FPI            int64    `json:"fpi"` // full-page images
	Bytes          int64    `json:"bytes"`
	BytesPerSend   *float64 `json:"bytes_per_send,omitempty"`
	RecordsPerSend *float64 `json:"records_per_send,omitempty"`
	// The window's first and last WAL insert positions: what was written
	// in between can be broken down by record kind and relation with
	// pg_walinspect (docs/loadtest.md).
	StartLSN string `json:"start_lsn,omitempty"`
	EndLSN   string `json:"end_lsn,omitempty"`
}

// walStat is one reading of pg_stat_wal.
type walStat struct {
	records, fpi int64
	pos          int64  // the WAL insert position, in bytes
	lsn          string // the same, as PostgreSQL writes it
}

// probes are the running probes of a run.
type probes struct {
	pg  *pgx.Conn // the commit probe's connection (nil: none)
	wal *pgx.Conn // pg_stat_wal readings, apart from the probe's own
	// The PostgreSQL backends of pg and wal: their CPU is the tool's, not
	// the server's, so the report shows it apart ("pg-probe").
	backends []int
	rdb      *redis.Client // the PING probe's client (nil: none)
	stop     chan struct{} // closed by stopLoops
}

// connectProbes connects the configured probes (nil if none): the
// commit probe's table is created, or emptied.
func connectProbes(ctx context.Context, cfg Config) (*probes, error) {
	if cfg.ProbePostgres == "" && cfg.ProbeRedis == "" {
		return nil, nil
	}
	p := &probes{stop: make(chan struct{})}
	if cfg.ProbePostgres != "" {
		var err error
		if p.pg, err = pgx.Connect(ctx, cfg.ProbePostgres); err != nil {
			return nil, fmt.Errorf("probe: postgres: %w", err)
		}
		if p.wal, err = pgx.Connect(ctx, cfg.ProbePostgres); err != nil {
			p.close()
			return nil, fmt.Errorf("probe: postgres: %w", err)
		}
		if _, err := p.pg.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+probeTable+` (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now());
			TRUNCATE `+probeTable); err != nil {
			p.close()
			return nil, fmt.Errorf("probe: creating %s: %w", probeTable, err)
		}
		for _, c := range []*pgx.Conn{p.pg, p.wal} {
			if pid := c.PgConn().PID(); pid > 0 {
				p.backends = append(p.backends, int(pid))
			}
		}
	}
	if cfg.ProbeRedis != "" {
		opt, err := redis.ParseURL(cfg.ProbeRedis)
		if err != nil {
			p.close()
			return nil, fmt.Errorf("probe: redis: %w", err)
		}
		opt.PoolSize = 1
		p.rdb = redis.NewClient(opt)
		if err := p.rdb.Ping(ctx).Err(); err != nil {
			p.close()
			return nil, fmt.Errorf("probe: redis: %w", err)
		}
	}
	return p, nil
}

// start adds the probes' series to r's timeline and starts them (in
// r's goroutines); stopLoops ends them.
func (p *probes) start(r *runner) {
	if p == nil {
		return
	}
	var loops []func()
	if p.pg != nil {
		h := NewHist()
		r.series = append(r.series, series{"pg_commit", h})
		loops = append(loops, func() {
			r.probeLoop(p.stop, h, func(ctx context.Context) error {
				_, err := p.pg.Exec(ctx, `INSERT INTO `+probeTable+` DEFAULT VALUES`)
				return err
			})
		})
	}
	if p.rdb != nil {
		h := NewHist()
		r.series = append(r.series, series{"redis_ping", h})
		loops = append(loops, func() {
			r.probeLoop(p.stop, h, func(ctx context.Context) error { return p.rdb.Ping(ctx).Err() })
		})
	}
	for _, loop := range loops {
		r.goroutine(loop)
	}
}

// probeLoop runs probe at Config.ProbeRate until stop, one at a time,
// recording each one's latency from its intended start into h. A failed
// probe is counted as an error (PROBE_FAILED) and recorded as it took.
func (r *runner) probeLoop(stop <-chan struct{}, h *Hist, probe func(context.Context) error) {
	every := time.Duration(float64(time.Second) / r.cfg.ProbeRate)
	next := r.clk.now()
	for {
		if d := time.Duration(next - r.clk.now()); d > 0 {
			select {
			case <-stop:
				return
			case <-time.After(d):
			}
		} else {
			select {
			case <-stop:
				return
			default:
			}
		}
		ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
		err := probe(ctx)
		cancel()
		if err != nil {
			r.errs.Add("PROBE_FAILED", 1)
		}
		h.Record(0, r.clk.now()-next)
		next += int64(every)
		if now := r.clk.now(); next < now-int64(time.Second) {
			next = now // more than a second behind (a long stall): start over from now
		}
	}
}

// readWAL reads pg_stat_wal (ok false without the commit probe's
// database, or when it cannot be read).
func (p *probes) readWAL(ctx context.Context) (walStat, bool) {
	if p == nil || p.wal == nil {
		return walStat{}, false
	}
	var w walStat
	err := p.wal.QueryRow(ctx, `SELECT wal_records, wal_fpi, pg_wal_lsn_diff(l, '0/0')::bigint, l::text
		FROM pg_stat_wal, pg_current_wal_insert_lsn() l`).Scan(&w.records, &w.fpi, &w.pos, &w.lsn)
	return w, err == nil
}

// stopLoops ends the probes (started or not).
func (p *probes) stopLoops() {
	if p == nil {
		return
	}
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
}

// close closes the probes' connections, once their loops ended.
func (p *probes) close() {
	if p == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if p.pg != nil {
		p.pg.Close(ctx)
	}
	if p.wal != nil {
		p.wal.Close(ctx)
	}
	if p.rdb != nil {
		p.rdb.Close()
	}
}

// walUse is the WAL written between a and b, per confirmed send.
func walUse(a, b walStat, confirmed int64) *WALUse {
	w := &WALUse{Records: b.records - a.records, FPI: b.fpi - a.fpi, Bytes: b.pos - a.pos, StartLSN: a.lsn, EndLSN: b.lsn}
	if confirmed > 0 {
		bps := round3(float64(w.Bytes) / float64(confirmed))
		rps := round3(float64(w.Records) / float64(confirmed))
		w.BytesPerSend, w.RecordsPerSend = &bps, &rps
	}
	return w
}
