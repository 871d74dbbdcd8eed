// Command webhookfloor measures the CPU one webhook notification costs on
// loopback HTTP, on each side: the floor under the notifier's CPU per
// notification, and under the load tester's sink's. The sender is the
// project's provider (notify.NewWebhook with parleyd's client,
// notify.HTTPClient, notify_concurrency = -workers) called from -workers
// goroutines, each with its own notify_timeout context as the notifier's
// senders do; the receiver is this program again, in a child process
// pinned to -sink-cpu when taskset is available, doing per request what
// the load tester's notify sink does (read the body, check the
// signature, decode ts and count, count the idempotency key, 204). After
// a warm-up of 5,000 notifications it sends -n more and reports
// requests/s and each side's CPU (user + system) per notification. Pin it
// to another core than the sink:
//
//	taskset -c 0 go run ./tools/webhookfloor
package main

import (
	"bufio"
	"context"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/notify"
)

const (
	warmup  = 5000
	timeout = 2 * time.Minute // the whole run; the sink exits after it too
)

func main() {
	role := flag.String("role", "sender", "sender, or sink (the child process)")
	addr := flag.String("addr", "127.0.0.1:39998", "loopback address the sink listens on (port 0: any free one)")
	n := flag.Int("n", 200000, "notifications measured (after a warm-up of 5,000)")
	workers := flag.Int("workers", 64, "sending goroutines, and notify_concurrency")
	sinkCPU := flag.String("sink-cpu", "1", "core for the sink (taskset -c)")
	secret := flag.String("secret", "s", "webhook secret")
	flag.Parse()
	if *role == "sink" {
		if err := sink(*addr, []byte(*secret)); err != nil {
			fmt.Fprintln(os.Stderr, "webhookfloor sink:", err)
			os.Exit(1)
		}
		return
	}
	if err := send(*addr, *n, *workers, *sinkCPU, *secret); err != nil {
		fmt.Fprintln(os.Stderr, "webhookfloor:", err)
		os.Exit(1)
	}
}

// stats is the sink's answer to GET /stats: requests and CPU since the
// last GET /reset.
type stats struct {
	Requests int64 `json:"requests"`
	CPUNs    int64 `json:"cpu_ns"`
}

// sink serves the webhook on addr until killed (or timeout).
func sink(addr string, secret []byte) error {
	time.AfterFunc(timeout+10*time.Second, func() { os.Exit(2) })
	var (
		mu   sync.Mutex
		keys = map[string]int{}
		reqs atomic.Int64
		c0   atomic.Int64
	)
	c0.Store(int64(cpu()))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/reset":
			reqs.Store(0)
			c0.Store(int64(cpu()))
			return
		case "/stats":
			_ = json.NewEncoder(w).Encode(stats{Requests: reqs.Load(), CPUNs: int64(cpu()) - c0.Load()})
			return
		}
		// As loadtest's notifySink.ServeHTTP, less its latency histogram.
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		ts := r.Header.Get(notify.HeaderTimestamp)
		if !hmac.Equal([]byte(notify.Sign(secret, ts, body)), []byte(r.Header.Get(notify.HeaderSignature))) {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var p struct {
			Ts    int64 `json:"ts"`
			Count int64 `json:"count"`
		}
		_ = json.Unmarshal(body, &p)
		reqs.Add(1)
		key := r.Header.Get(notify.HeaderIdempotency)
		mu.Lock()
		keys[key]++
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Println(ln.Addr()) // ready
	return (&http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}).Serve(ln)
}

func send(addr string, n, workers int, sinkCPU, secret string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	args := []string{"-role", "sink", "-addr", addr, "-secret", secret}
	cmd := exec.Command(os.Args[0], args...)
	if taskset, err := exec.LookPath("taskset"); err == nil {
		cmd = exec.Command(taskset, append([]string{"-c", sinkCPU, os.Args[0]}, args...)...)
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	t := time.AfterFunc(10*time.Second, func() { _ = cmd.Process.Kill() })
	ready, err := bufio.NewReader(out).ReadString('\n') // the sink's address, once it listens
	t.Stop()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); cancel(); close(exited) }() // a sink that dies ends the run
	defer func() { _ = cmd.Process.Kill(); <-exited }()
	if err != nil {
		return fmt.Errorf("sink not up: %w", err)
	}
	base := "http://" + strings.TrimSpace(ready)
	var st stats
	cfg := config.Default()
	cfg.NotifyConcurrency = workers
	wh := notify.NewWebhook(base+"/hook", secret, notify.HTTPClient(cfg))
	var errs, next atomic.Int64
	first := make(chan error, 1)
	run := func(from, to int64) { // notifications from ..< to
		next.Store(from)
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					i := next.Add(1) - 1
					if i >= to {
						return
					}
					sctx, scancel := context.WithTimeout(ctx, cfg.NotifyTimeout)
					if err := wh.Send(sctx, notification(i)); err != nil {
						errs.Add(1)
						select {
						case first <- err:
						default:
						}
					}
					scancel()
				}
			}()
		}
		wg.Wait()
	}
	run(0, warmup)
	if err := get(ctx, base+"/reset", nil); err != nil {
		return err
	}
	c0, t0 := cpu(), time.Now()
	run(warmup, int64(warmup+n))
	used, wall := cpu()-c0, time.Since(t0)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("run: %w", err)
	}
	if err := get(ctx, base+"/stats", &st); err != nil {
		return err
	}
	fn := float64(n)
	parent, sinkUs := float64(used.Nanoseconds())/1e3/fn, float64(st.CPUNs)/1e3/fn
	fmt.Printf("webhookfloor: %d notifications (after %d warm-up), %d workers, sink on cpu %s, %d requests at the sink, %.2fs\n",
		n, warmup, workers, sinkCPU, st.Requests, wall.Seconds())
	fmt.Printf("requests/s:  %.0f\n", fn/wall.Seconds())
	fmt.Printf("sender CPU:  %.2f µs/notification\n", parent)
	fmt.Printf("sink CPU:    %.2f µs/notification\n", sinkUs)
	fmt.Printf("sum:         %.2f µs/notification\n", parent+sinkUs)
	fmt.Printf("errors:      %d\n", errs.Load())
	if e := errs.Load(); e > 0 {
		return fmt.Errorf("%d sends failed, first: %w", e, <-first)
	}
	if st.Requests != int64(n) {
		return fmt.Errorf("sink saw %d requests, want %d", st.Requests, n)
	}
	return nil
}

// notification i is a message notification, ids of realistic sizes.
func notification(i int64) *notify.Notification {
	s := strconv.FormatInt(i, 10)
	dev, conv := "dev_01HZX4Q7"+pad(i%100000), "grp_01HZX4"+pad(i%5000)
	return &notify.Notification{Device: dev, User: "usr_01HZX4Q7" + pad(i%100000), Token: "wh_" + pad(i) + pad(i%7),
		Conv: conv, Seq: i + 1, Kind: notify.KindMsg, Sender: "usr_01HZX4R2" + pad(i%997), Count: 1, Badge: 1 + i%40,
		Title: "Team standup " + s, Ts: time.Now().UnixMilli(), Key: dev + ":" + conv + ":" + strconv.FormatInt(i+1, 10)}
}

// pad is i as 8 digits, zero-padded.
func pad(i int64) string {
	s := strconv.FormatInt(i%100000000, 10)
	return "00000000"[len(s):] + s
}

// get GETs url (any 2xx) and decodes its JSON into v unless v is nil.
func get(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return errors.New(url + ": " + resp.Status)
	}
	if v == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// cpu is this process's user + system CPU time so far.
func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
