// Command benchmd turns the raw results of tools/bench.sh (parley-load
// JSON reports, `go test -bench` output, reference ceilings) into
// BENCHMARKS.md: medians of the repeated runs, with their spread.
//
//	go run ./tools/benchmd -dir RESULTS > BENCHMARKS.md
//	go run ./tools/benchmd -ab RESULTS   # the table of tools/ab.sh
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

type lat struct{ P50, P90, P99, P999, Max float64 }

type cpu struct {
	Name      string  `json:"name"`
	Cores     float64 `json:"cores"`
	UsPerSend float64 `json:"us_per_send"`
}

type report struct {
	TargetRate     float64        `json:"target_rate"`
	Pairs          int            `json:"pairs"`
	ConfirmedPerS  float64        `json:"confirmed_per_s"`
	DeliveriesPerS float64        `json:"deliveries_per_s"`
	Lost           int64          `json:"lost"`
	Duplicated     int64          `json:"duplicated"`
	Errors         map[string]int `json:"errors"`
	SendOK         lat            `json:"send_ok_ms"`
	Push           lat            `json:"push_ms"`
	ReadOK         *lat           `json:"read_ok_ms"`
	Latency        map[string]lat `json:"latency_ms"` // the probes: pg_commit, redis_ping
	WAL            *struct {
		BytesPerSend float64 `json:"bytes_per_send"`
	} `json:"wal"`
	CPU []cpu `json:"cpu"`
}

func (l *lat) UnmarshalJSON(b []byte) error {
	var m map[string]float64
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*l = lat{m["p50"], m["p90"], m["p99"], m["p999"], m["max"]}
	return nil
}

func main() {
	dir := flag.String("dir", "", "results directory written by tools/bench.sh")
	ab := flag.String("ab", "", "results directory written by tools/ab.sh: print its comparison instead")
	flag.Parse()
	if *ab != "" {
		if err := abTable(*ab); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "usage: benchmd -dir RESULTS")
		os.Exit(2)
	}
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(*dir, name))
		return strings.TrimSpace(string(b))
	}

	fmt.Println("# Benchmarks")
	fmt.Println()
	fmt.Println("Written by `make bench` (tools/bench.sh, then tools/benchmd). Every figure is the")
	fmt.Println("median of the repeated runs, with the range (min–max) so the noise shows. Latencies")
	fmt.Println("are measured open-loop from each request's intended start (parley-load), so a stall")
	fmt.Println("shows in the percentiles. parleyd is pinned to core 0 and the load generator to core 1;")
	fmt.Println("PostgreSQL and Redis are not pinned and share both cores.")
	fmt.Println()
	fmt.Println("## Machine")
	fmt.Println()
	fmt.Println("```")
	fmt.Println(read("machine.txt"))
	fmt.Println("```")
	fmt.Println()

	fmt.Println("## Reference ceilings, measured in the same run")
	fmt.Println()
	fmt.Println("| what | result | command |")
	fmt.Println("|---|---|---|")
	incr1, incr16 := read("redis_incr_p1.txt"), read("redis_incr_p16.txt")
	fmt.Printf("| Redis INCR, unpipelined | %s | `redis-benchmark -t incr -n 200000 -q` |\n", firstLine(incr1))
	fmt.Printf("| Redis INCR, pipelined by 16 | %s | `redis-benchmark -t incr -n 1000000 -P 16 -q` |\n", firstLine(incr16))
	pg := parseBench(read("pg_insert.txt"))
	for _, name := range sortedKeys(pg) {
		fmt.Printf("| PostgreSQL insert, %s | %s rows/s | `go test -run '^$' -bench InsertCeiling ./store/` |\n",
			strings.TrimPrefix(name, "BenchmarkInsertCeiling/"), pg[name]["rows/s"])
	}
	fmt.Println()

	fmt.Println("## Codec")
	fmt.Println()
	fmt.Println("`go test -run '^$' -bench . -benchtime 1s -count 3 ./wire/` (median of 3):")
	fmt.Println()
	fmt.Println("| benchmark | ns/op | allocs/op | frames/s on one core |")
	fmt.Println("|---|---|---|---|")
	codec := parseBench(read("codec.txt"))
	for _, name := range sortedKeys(codec) {
		ns, _ := strconv.ParseFloat(codec[name]["ns/op"], 64)
		fmt.Printf("| %s | %s | %s | %.0f |\n", name, codec[name]["ns/op"], codec[name]["allocs/op"], 1e9/ns)
	}
	fmt.Println()

	fmt.Println("## Durable 1:1 sends (`parley-load direct`)")
	fmt.Println()
	fmt.Println("200 pairs (400 connections), 100-byte bodies, every device acks 50 ms after the first event it has not acked (as `client` AutoAck does), 10 s per run,")
	fmt.Println("each after a warm-up at the same rate (`-warmup`, left out of the figures; all runs on one server, in the order of the table).")
	fmt.Println("`send_ok` is send → send_ok (committed in PostgreSQL); `push` is send → push at the receiver; `pg probe` is a bare one-row")
	fmt.Println("commit run beside the load (`-probe-postgres`, 200/s): what the host's storage gave any commit meanwhile. CPU and WAL are per confirmed send.")
	fmt.Println()
	rates := loadTable(*dir, "direct_*.json", "target/s", func(r report) int { return int(r.TargetRate) })
	if len(rates) > 0 {
		top := rates[len(rates)-1]
		best := 0.0
		for _, r := range top {
			best = max(best, r.ConfirmedPerS)
		}
		pg100, _ := strconv.ParseFloat(pg["BenchmarkInsertCeiling/rows=100"]["rows/s"], 64)
		incr, _ := strconv.ParseFloat(strings.Fields(firstLine(incr1) + " 0")[0], 64)
		if pg100 > 0 && incr > 0 {
			fmt.Printf("At the highest rate, the best run confirmed %.0f sends/s: %.0f%% of the 100-row-batch PostgreSQL insert ceiling "+
				"and %.0f%% of unpipelined Redis INCR, measured above in the same run.\n\n", best, 100*best/pg100, 100*best/incr)
		}
	}
	if files, _ := filepath.Glob(filepath.Join(*dir, "pairs_*.json")); len(files) > 0 {
		fmt.Println("### Many conversations")
		fmt.Println()
		fmt.Println("`direct` at 5,000 sends/s with more pairs (each pair is a conversation), a fresh server for each count, no warm-up:")
		fmt.Println("what costs in proportion to the active conversations shows here.")
		fmt.Println()
		loadTable(*dir, "pairs_*.json", "pairs", func(r report) int { return r.Pairs })
	}
	if files, _ := filepath.Glob(filepath.Join(*dir, "onecore_*.json")); len(files) > 0 {
		fmt.Println("### One-core budget")
		fmt.Println()
		fmt.Println("`direct`, 200 pairs, with parleyd, its Redis and the PostgreSQL postmaster with its backends all on core 0 (the load tool on core 1),")
		fmt.Println("a fresh server, warm-up first: how Parley compares with servers that are measured on one core.")
		fmt.Println()
		loadTable(*dir, "onecore_*.json", "target/s", func(r report) int { return int(r.TargetRate) })
	}
	if files, _ := filepath.Glob(filepath.Join(*dir, "mixed_*.json")); len(files) > 0 {
		fmt.Println("## The realistic mix (`parley-load mixed`)")
		fmt.Println()
		fmt.Println("1,000 users with 1.6 devices each on average (1,600 connections), 4 direct conversations per user and 50 groups of 20;")
		fmt.Println("30% of pushes are read a second later; devices ack as `client` AutoAck does. 20 s per run after a 3 s warm-up, a fresh server each rate.")
		fmt.Println()
		loadTable(*dir, "mixed_*.json", "target/s", func(r report) int { return int(r.TargetRate) })
	}
	fmt.Println("Latencies in ms. Commands:")
	fmt.Println()
	fmt.Println("```")
	fmt.Println(read("commands.txt"))
	fmt.Println("```")
	if extra := read("extra.md"); extra != "" {
		fmt.Println()
		fmt.Println(extra)
	}
}

// loadTable prints one table of parley-load runs (the JSON reports
// matching pattern in dir), a row per key (a rate, a pair count), each
// cell the median of the row's runs with their range; it returns the
// rows' runs in key order.
func loadTable(dir, pattern, keyName string, key func(report) int) [][]report {
	files, _ := filepath.Glob(filepath.Join(dir, pattern))
	byKey := map[int][]report{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var r report
		if json.Unmarshal(b, &r) == nil {
			byKey[key(r)] = append(byKey[key(r)], r)
		}
	}
	var keys []int
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	reads := false
	for _, rs := range byKey {
		for _, r := range rs {
			reads = reads || r.ReadOK != nil
		}
	}
	head := "| " + keyName + " | confirmed/s | send_ok p50 | send_ok p99 | push p99 |"
	if reads {
		head += " read_ok p99 |"
	}
	head += " pg probe p99 | parleyd µs/send | PostgreSQL µs/send | Redis µs/send | machine cores | WAL B/send | lost | dup | runs |"
	fmt.Println(head)
	fmt.Println("|" + strings.Repeat("---|", strings.Count(head, "|")-1))
	var out [][]report
	for _, k := range keys {
		rs := byKey[k]
		out = append(out, rs)
		col := func(f func(report) float64) string { return medianRange(rs, f) }
		var lost, dup int64
		for _, r := range rs {
			lost += r.Lost
			dup += r.Duplicated
		}
		row := fmt.Sprintf("| %d | %s | %s | %s | %s |", k, col(func(r report) float64 { return r.ConfirmedPerS }),
			col(func(r report) float64 { return r.SendOK.P50 }), col(func(r report) float64 { return r.SendOK.P99 }),
			col(func(r report) float64 { return r.Push.P99 }))
		if reads {
			row += " " + col(func(r report) float64 {
				if r.ReadOK == nil {
					return 0
				}
				return r.ReadOK.P99
			}) + " |"
		}
		row += fmt.Sprintf(" %s | %s | %s | %s | %s | %s | %d | %d | %d |",
			col(func(r report) float64 { return r.Latency["pg_commit"].P99 }),
			col(cpuOf("server")), col(cpuOf("postgres")), col(cpuOf("redis")), col(cpuOf("machine")),
			col(func(r report) float64 {
				if r.WAL == nil {
					return 0
				}
				return r.WAL.BytesPerSend
			}), lost, dup, len(rs))
		fmt.Println(row)
	}
	fmt.Println()
	return out
}

// cpuOf is the named process's CPU per confirmed send ("machine": the
// cores the whole machine used).
func cpuOf(name string) func(report) float64 {
	return func(r report) float64 {
		for _, c := range r.CPU {
			if c.Name == name {
				if name == "machine" {
					return c.Cores
				}
				return c.UsPerSend
			}
		}
		return 0
	}
}

var rpsLine = regexp.MustCompile(`INCR: ([0-9.]+) requests per second`)

// firstLine picks the final rate out of redis-benchmark -q output (which
// also holds \r-separated progress lines).
func firstLine(s string) string {
	if m := rpsLine.FindAllStringSubmatch(s, -1); len(m) > 0 {
		return m[len(m)-1][1] + " ops/s"
	}
	return strings.TrimSpace(s)
}

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(-\d+)?\s+\d+\s+(.*)$`)

// parseBench reads `go test -bench` output: name -> unit -> median value.
func parseBench(out string) map[string]map[string]string {
	vals := map[string]map[string][]float64{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil {
			continue
		}
		f := strings.Fields(m[3])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			if vals[m[1]] == nil {
				vals[m[1]] = map[string][]float64{}
			}
			vals[m[1]][f[i+1]] = append(vals[m[1]][f[i+1]], v)
		}
	}
	out2 := map[string]map[string]string{}
	for name, units := range vals {
		out2[name] = map[string]string{}
		for unit, vs := range units {
			sort.Float64s(vs)
			out2[name][unit] = strconv.FormatFloat(vs[len(vs)/2], 'f', -1, 64)
		}
	}
	return out2
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func medianRange(rs []report, f func(report) float64) string {
	vs := make([]float64, len(rs))
	for i, r := range rs {
		vs[i] = f(r)
	}
	sort.Float64s(vs)
	med := vs[len(vs)/2]
	if len(vs) == 1 || vs[0] == vs[len(vs)-1] {
		return trim(med)
	}
	return fmt.Sprintf("%s (%s–%s)", trim(med), trim(vs[0]), trim(vs[len(vs)-1]))
}

func trim(v float64) string {
	switch {
	case v >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}
