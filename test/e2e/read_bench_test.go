package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/wire"
)

// BenchmarkReadOpenLoop measures read → read_ok at a fixed rate against a
// parleyd process pinned to core 0 (this process should run on core 1):
//
//	taskset -c 1 go test -run '^$' -bench ReadOpenLoop -benchtime 1x ./server/
//
// 200 users, each with two devices (so every read that advances sends a
// read_changed to the other device) in 10 groups of 20 with 200 messages
// each. Reads are scheduled by the clock (open loop) at 5,000/s for 5 s,
// each at a seq a little above the user's last one; latency is measured
// from the scheduled time. Reports p50/p99/max and parleyd CPU per read.
func BenchmarkReadOpenLoop(b *testing.B) {
	const users, groups, perGroup, msgs = 200, 10, 20, 200
	const rate, dur = 5000, 5 * time.Second
	cfg := parleytest.Config(b)
	cfg.SendRate = 0
	p := parleytest.StartProcess(b, cfg)
	_ = exec.Command("taskset", "-a", "-p", "-c", "0", strconv.Itoa(p.Pid())).Run()

	ids := make([]string, users)
	devs := make([]map[string]string, 0, 2*users)
	for i := range ids {
		ids[i] = fmt.Sprintf("r%d", i)
		devs = append(devs, map[string]string{"id": ids[i] + "-a", "user": ids[i]}, map[string]string{"id": ids[i] + "-b", "user": ids[i]})
	}
	if st := parleytest.AdminCall(b, p.AdminURL, "POST", "/v1/bulk/users", map[string]any{"ids": ids}, nil); st != http.StatusCreated {
		b.Fatal(st)
	}
	var out struct {
		Devices []struct{ ID, User, Token string }
	}
	if st := parleytest.AdminCall(b, p.AdminURL, "POST", "/v1/bulk/devices", map[string]any{"devices": devs}, &out); st != http.StatusCreated {
		b.Fatal(st)
	}
	ctx := context.Background()
	conns := make([]*client.Conn, len(out.Devices))
	for i, d := range out.Devices {
		c, err := client.Dial(ctx, p.Addr, d.ID, d.Token, client.DialOptions{OnServerFrame: func(wire.Message) {}})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	// Groups: users g*perGroup … +perGroup-1; the first member sends.
	for g := 0; g < groups; g++ {
		conv := fmt.Sprintf("rg%d", g)
		if st := parleytest.AdminCall(b, p.AdminURL, "POST", "/v1/conversations",
			map[string]any{"id": conv, "kind": "group", "members": ids[g*perGroup : (g+1)*perGroup]}, nil); st != http.StatusCreated {
			b.Fatal(st)
		}
		sender := conns[2*g*perGroup]
		for m := 0; m < msgs; m++ {
			if _, err := sender.Send(ctx, conv, strconv.Itoa(m), []byte("m")); err != nil {
				b.Fatal(err)
			}
		}
	}
	for b.Loop() {
		h := hdrhistogram.New(1, 10_000_000, 3)
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := 0
		cpu0 := procCPU(p.Pid())
		start := time.Now()
		next := make([]int64, users)
		for i := range next {
			next[i] = 1
		}
		for k := 0; ; k++ {
			at := start.Add(time.Duration(k) * time.Second / rate)
			if at.Sub(start) >= dur {
				break
			}
			if d := time.Until(at); d > 0 {
				time.Sleep(d) // pacing: an open-loop load at rate
			}
			u := k % users
			next[u] = min(next[u]+1, msgs+1)
			seq := next[u]
			c := conns[2*u+k/users%2] // alternate the user's devices
			conv := fmt.Sprintf("rg%d", u/perGroup)
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := c.Read(ctx, conv, seq)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs++
					return
				}
				_ = h.RecordValue(time.Since(at).Microseconds())
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		cpu := procCPU(p.Pid()) - cpu0
		if errs > 0 {
			b.Fatalf("%d reads failed", errs)
		}
		b.ReportMetric(float64(h.TotalCount())/elapsed.Seconds(), "reads/s")
		b.ReportMetric(float64(h.ValueAtQuantile(50))/1000, "p50-ms")
		b.ReportMetric(float64(h.ValueAtQuantile(99))/1000, "p99-ms")
		b.ReportMetric(float64(h.Max())/1000, "max-ms")
		b.ReportMetric(cpu.Seconds()*1e6/float64(h.TotalCount()), "parleyd-µs/read")
	}
}
