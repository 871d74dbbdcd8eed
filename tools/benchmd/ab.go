package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// abTable prints the runs of tools/ab.sh in dir (A_N.json, B_N.json) as a
// Markdown table, one row per run in the order they ran, then each
// build's medians with their range.
func abTable(dir string) error {
	what, _ := os.ReadFile(filepath.Join(dir, "what.txt"))
	fmt.Printf("%s\n\n", strings.TrimSpace(string(what)))
	runs := map[string][]report{}
	cols := []struct {
		name string
		f    func(report) float64
	}{
		{"confirmed/s", func(r report) float64 { return r.ConfirmedPerS }},
		{"send_ok p50 ms", func(r report) float64 { return r.SendOK.P50 }},
		{"p99", func(r report) float64 { return r.SendOK.P99 }},
		{"p99.9", func(r report) float64 { return r.SendOK.P999 }},
		{"push p99 ms", func(r report) float64 { return r.Push.P99 }},
		{"read_ok p99 ms", func(r report) float64 {
			if r.ReadOK == nil {
				return 0
			}
			return r.ReadOK.P99
		}},
		{"pg probe p99 ms", func(r report) float64 { return r.Latency["pg_commit"].P99 }},
		{"parleyd µs/send", cpuOf("server")},
		{"postgres µs/send", cpuOf("postgres")},
		{"redis µs/send", cpuOf("redis")},
		{"all-in µs/send", func(r report) float64 {
			return cpuOf("server")(r) + cpuOf("postgres")(r) + cpuOf("redis")(r)
		}},
		{"WAL B/send", func(r report) float64 {
			if r.WAL == nil {
				return 0
			}
			return r.WAL.BytesPerSend
		}},
		{"lost", func(r report) float64 { return float64(r.Lost) }},
		{"dup", func(r report) float64 { return float64(r.Duplicated) }},
	}
	header := "| build | run |"
	for _, c := range cols {
		header += " " + c.name + " |"
	}
	fmt.Println(header)
	fmt.Println("|---|---|" + strings.Repeat("---|", len(cols)))
	for n := 1; ; n++ {
		found := false
		for _, side := range []string{"A", "B"} {
			b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%s_%d.json", side, n)))
			if err != nil {
				continue
			}
			var r report
			if err := json.Unmarshal(b, &r); err != nil {
				return fmt.Errorf("%s_%d.json: %w", side, n, err)
			}
			found = true
			runs[side] = append(runs[side], r)
			row := fmt.Sprintf("| %s | %d |", side, n)
			for _, c := range cols {
				row += " " + trim(c.f(r)) + " |"
			}
			fmt.Println(row)
		}
		if !found {
			break
		}
	}
	fmt.Println()
	fmt.Println("Medians (min–max):")
	fmt.Println()
	fmt.Println(header)
	fmt.Println("|---|---|" + strings.Repeat("---|", len(cols)))
	for _, side := range []string{"A", "B"} {
		if len(runs[side]) == 0 {
			continue
		}
		row := fmt.Sprintf("| %s | %d runs |", side, len(runs[side]))
		for _, c := range cols {
			row += " " + medianRange(runs[side], c.f) + " |"
		}
		fmt.Println(row)
	}
	return nil
}
