// Command relayfloor measures the least CPU a gnet server spends per
// relayed frame in the typing scenario's traffic: the floor under the
// gateway's CPU per typing frame received. It is a relay and nothing
// else: no decoding beyond a length prefix, no member lists, no routes,
// no limits.
//
// The relay (this process) listens on -addr with gnet, configured as the
// gateway configures it. A child process (this program again, pinned to
// -typist-cpu when taskset is available) opens -devices connections,
// says which device each is, and writes -rate frames per second in all
// (each device on its own clock, to one of its groups picked at random).
// Devices are in groups of -size, -groups per device on average, as
// `parley-load typing` sets them up. The relay appends each frame to the
// outboxes of the group's other members, and every -coalesce a ticker
// goroutine hands each non-empty outbox to gnet's AsyncWrite: one write
// per device and flush, as many as the gateway's relay_coalesce flush
// makes (its loop takes the outbox when it writes; the count is the
// same). After -warmup it reports, over
// -duration, its own CPU (user and system) per frame read and per frame
// relayed, and the system calls it made (/proc/self/io). Pin it to
// another core than the typists:
//
//	taskset -c 0 go run ./tools/relayfloor
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/panjf2000/gnet/v2"
)

type config struct {
	addr               string
	devices, size, per int
	rate               int
	body               int
	coalesce           time.Duration
	warmup, duration   time.Duration
	typistCPU          string
}

func main() {
	var cfg config
	role := flag.String("role", "relay", "relay, or typist (the child process)")
	flag.StringVar(&cfg.addr, "addr", "127.0.0.1:0", "loopback address the relay listens on (port 0: a free one)")
	flag.IntVar(&cfg.devices, "devices", 2000, "connections, a device each")
	flag.IntVar(&cfg.size, "size", 5, "members per group")
	flag.IntVar(&cfg.per, "groups", 20, "groups per device (groups in all: devices × groups / size)")
	flag.IntVar(&cfg.rate, "rate", 10000, "frames written per second, all devices together")
	flag.IntVar(&cfg.body, "body", 40, "bytes per frame after the 4-byte length (a typing frame's size)")
	flag.DurationVar(&cfg.coalesce, "coalesce", 100*time.Millisecond, "how often outboxes are flushed (relay_coalesce)")
	flag.DurationVar(&cfg.warmup, "warmup", 5*time.Second, "time before measuring")
	flag.DurationVar(&cfg.duration, "duration", 20*time.Second, "time measured")
	flag.StringVar(&cfg.typistCPU, "typist-cpu", "1", "core for the typists (taskset -c)")
	flag.Parse()
	var err error
	if *role == "typist" {
		err = typists(cfg)
	} else {
		err = relayRun(cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "relayfloor:", err)
		os.Exit(1)
	}
}

// members returns each group's devices: slot i of all groups × size
// slots belongs to device i mod devices, so every device is in per
// groups and a group's members are distinct while size ≤ devices.
func members(cfg config) [][]uint32 {
	groups := cfg.devices * cfg.per / cfg.size
	m := make([][]uint32, groups)
	for g := range m {
		for j := 0; j < cfg.size; j++ {
			m[g] = append(m[g], uint32((g*cfg.size+j)%cfg.devices))
		}
	}
	return m
}

// outbox is one device's frames waiting for the next flush.
type outbox struct {
	mu       sync.Mutex
	c        gnet.Conn
	out      []byte
	spare    []byte
	inFlight bool
}

type relay struct {
	gnet.BuiltinEventEngine
	cfg     config
	groups  [][]uint32
	boxes   []outbox
	joined  atomic.Int64
	read    atomic.Int64 // frames read
	relayed atomic.Int64 // copies appended to outboxes
	writes  atomic.Int64 // AsyncWrite calls
	eng     gnet.Engine
	started chan struct{}
}

const helloLen = 4 // a hello's body: the device number

func (r *relay) OnBoot(e gnet.Engine) gnet.Action {
	r.eng = e
	close(r.started)
	return gnet.None
}

// OnTraffic reads whole frames: the first of a connection names its
// device, each later one names a group (its first 4 bytes) and goes to
// the group's other members.
func (r *relay) OnTraffic(c gnet.Conn) gnet.Action {
	for {
		n := c.InboundBuffered()
		if n < 4 {
			return gnet.None
		}
		buf, _ := c.Peek(n)
		size := int(binary.BigEndian.Uint32(buf))
		if n < 4+size {
			return gnet.None
		}
		frame := buf[:4+size]
		if c.Context() == nil {
			dev := binary.BigEndian.Uint32(frame[4:])
			c.SetContext(dev)
			b := &r.boxes[dev]
			b.mu.Lock()
			b.c = c
			b.mu.Unlock()
			r.joined.Add(1)
		} else {
			from := c.Context().(uint32)
			g := binary.BigEndian.Uint32(frame[4:]) % uint32(len(r.groups))
			for _, m := range r.groups[g] {
				if m == from {
					continue
				}
				b := &r.boxes[m]
				b.mu.Lock()
				b.out = append(b.out, frame...)
				b.mu.Unlock()
				r.relayed.Add(1)
			}
			r.read.Add(1)
		}
		_, _ = c.Discard(4 + size)
	}
}

// flushLoop hands every non-empty outbox to AsyncWrite each coalesce.
func (r *relay) flushLoop(stop <-chan struct{}) {
	t := time.NewTicker(r.cfg.coalesce)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		for i := range r.boxes {
			b := &r.boxes[i]
			b.mu.Lock()
			if b.c == nil || b.inFlight || len(b.out) == 0 {
				b.mu.Unlock()
				continue
			}
			data := b.out
			b.out, b.spare = b.spare[:0], nil
			b.inFlight = true
			c := b.c
			b.mu.Unlock()
			r.writes.Add(1)
			_ = c.AsyncWrite(data, func(gnet.Conn, error) error {
				b.mu.Lock()
				b.inFlight, b.spare = false, data[:0]
				b.mu.Unlock()
				return nil
			})
		}
	}
}

func relayRun(cfg config) error {
	if strings.HasSuffix(cfg.addr, ":0") {
		ln, err := net.Listen("tcp", cfg.addr)
		if err != nil {
			return err
		}
		cfg.addr = ln.Addr().String()
		_ = ln.Close()
	}
	r := &relay{cfg: cfg, groups: members(cfg), boxes: make([]outbox, cfg.devices), started: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		errc <- gnet.Run(r, "tcp://"+cfg.addr,
			gnet.WithMulticore(true),
			gnet.WithReusePort(false),
			gnet.WithReuseAddr(true),
			gnet.WithTCPNoDelay(gnet.TCPNoDelay),
			gnet.WithReadBufferCap(4096),
			gnet.WithWriteBufferCap(4096))
	}()
	select {
	case err := <-errc:
		return err
	case <-r.started:
	}
	defer func() { _ = r.eng.Stop(context.Background()) }()
	stop := make(chan struct{})
	defer close(stop)
	go r.flushLoop(stop)

	args := append([]string{"-role", "typist"}, os.Args[1:]...)
	args = append(args, "-addr", cfg.addr) // the last -addr counts
	cmd := exec.Command(os.Args[0], args...)
	if taskset, err := exec.LookPath("taskset"); err == nil {
		cmd = exec.Command(taskset, append([]string{"-c", cfg.typistCPU, os.Args[0]}, args...)...)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	for deadline := time.Now().Add(30 * time.Second); r.joined.Load() < int64(cfg.devices); {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d devices connected in 30 s", r.joined.Load(), cfg.devices)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(cfg.warmup)
	c0, io0, read0, rel0, w0, t0 := cpu(), syscalls(), r.read.Load(), r.relayed.Load(), r.writes.Load(), time.Now()
	time.Sleep(cfg.duration)
	c1, io1, wall := cpu(), syscalls(), time.Since(t0)
	read, rel, writes := r.read.Load()-read0, r.relayed.Load()-rel0, r.writes.Load()-w0
	if read == 0 || rel == 0 {
		return fmt.Errorf("nothing relayed in %s", wall)
	}
	user, sys := (c1[0]-c0[0]).Seconds()*1e6, (c1[1]-c0[1]).Seconds()*1e6
	fmt.Printf("devices %d, groups of %d (%d per device), coalesce %s: %.0f frames/s read, %.0f relayed/s, %.0f flushes/s; %.0f read and %.0f write system calls/s\n",
		cfg.devices, cfg.size, cfg.per, cfg.coalesce, float64(read)/wall.Seconds(), float64(rel)/wall.Seconds(), float64(writes)/wall.Seconds(),
		float64(io1[0]-io0[0])/wall.Seconds(), float64(io1[1]-io0[1])/wall.Seconds())
	fmt.Printf("relay CPU %.2f cores: %.2f µs per frame read, %.2f µs per frame relayed (user %.2f, system %.2f)\n",
		(user+sys)/1e6/wall.Seconds(), (user+sys)/float64(read), (user+sys)/float64(rel), user/float64(rel), sys/float64(rel))
	return nil
}

// typists connects every device and writes frames until killed.
func typists(cfg config) error {
	groups := members(cfg)
	mine := make([][]uint32, cfg.devices)
	for g, ms := range groups {
		for _, m := range ms {
			mine[m] = append(mine[m], uint32(g))
		}
	}
	every := time.Duration(float64(time.Second) * float64(cfg.devices) / float64(cfg.rate))
	for d := 0; d < cfg.devices; d++ {
		c, err := net.Dial("tcp", cfg.addr)
		if err != nil {
			return err
		}
		hello := make([]byte, 4+helloLen)
		binary.BigEndian.PutUint32(hello, helloLen)
		binary.BigEndian.PutUint32(hello[4:], uint32(d))
		if _, err := c.Write(hello); err != nil {
			return err
		}
		go func() { _, _ = io.Copy(io.Discard, c) }()
		go func(d int) {
			frame := make([]byte, 4+cfg.body)
			binary.BigEndian.PutUint32(frame, uint32(cfg.body))
			time.Sleep(time.Duration(rand.Int64N(int64(every))))
			t := time.NewTicker(every)
			for range t.C {
				binary.BigEndian.PutUint32(frame[4:], mine[d][rand.IntN(len(mine[d]))])
				if _, err := c.Write(frame); err != nil {
					return
				}
			}
		}(d)
	}
	select {}
}

// cpu is this process's user and system CPU time so far.
func cpu() [2]time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return [2]time.Duration{time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())}
}

// syscalls is this process's read and write system calls so far
// (syscr and syscw of /proc/self/io; zeros where there is none).
func syscalls() [2]int64 {
	var out [2]int64
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		var v int64
		if _, err := fmt.Sscanf(line, "syscr: %d", &v); err == nil {
			out[0] = v
		} else if _, err := fmt.Sscanf(line, "syscw: %d", &v); err == nil {
			out[1] = v
		}
	}
	return out
}
