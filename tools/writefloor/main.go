// Command writefloor measures the CPU one write system call costs the
// sender on loopback TCP: the floor under a gateway's CPU per delivery
// when every push is its own write. It opens -conns connections to a
// reader (this program again, in a child process, pinned to -reader-cpu
// when taskset is available), writes k frames' worth of bytes (-frame
// bytes each) to every connection per round, -rounds times, pausing
// -pause × k between rounds (so -k 1 is 50 messages/s per connection,
// like the large scenario), and reports its own CPU (user + system) per
// write and per frame. Pin it to another core than the reader:
//
//	taskset -c 0 go run ./tools/writefloor -k 1
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"
)

func main() {
	role := flag.String("role", "writer", "writer, or reader (the child process)")
	addr := flag.String("addr", "127.0.0.1:39999", "loopback address the writer listens on")
	conns := flag.Int("conns", 2000, "connections")
	rounds := flag.Int("rounds", 300, "rounds of one write per connection")
	k := flag.Int("k", 1, "frames per write")
	frame := flag.Int("frame", 120, "bytes per frame")
	pause := flag.Duration("pause", 20*time.Millisecond, "pause per frame between rounds")
	readerCPU := flag.String("reader-cpu", "1", "core for the reader (taskset -c)")
	flag.Parse()
	if *role == "reader" {
		read(*addr, *conns)
		return
	}
	if err := write(*addr, *conns, *rounds, *k, *frame, *pause, *readerCPU); err != nil {
		fmt.Fprintln(os.Stderr, "writefloor:", err)
		os.Exit(1)
	}
}

// read connects conns times and discards everything, until killed.
func read(addr string, conns int) {
	for i := 0; i < conns; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "writefloor reader:", err)
			os.Exit(1)
		}
		go func() { _, _ = io.Copy(io.Discard, c) }()
	}
	select {}
}

func write(addr string, conns, rounds, k, frame int, pause time.Duration, readerCPU string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	args := []string{"-role", "reader", "-addr", addr, "-conns", fmt.Sprint(conns)}
	cmd := exec.Command(os.Args[0], args...)
	if taskset, err := exec.LookPath("taskset"); err == nil {
		cmd = exec.Command(taskset, append([]string{"-c", readerCPU, os.Args[0]}, args...)...)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var fds []int
	for i := 0; i < conns; i++ {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		f, err := c.(*net.TCPConn).File() // a blocking duplicate: plain write(2) calls
		if err != nil {
			return err
		}
		fds = append(fds, int(f.Fd()))
	}
	buf := make([]byte, frame*k)
	c0, t0 := cpu(), time.Now()
	writes := 0
	for r := 0; r < rounds; r++ {
		for _, fd := range fds {
			if _, err := syscall.Write(fd, buf); err != nil {
				return err
			}
			writes++
		}
		time.Sleep(pause * time.Duration(k))
	}
	used, wall := cpu()-c0, time.Since(t0)
	us := float64(used.Microseconds())
	fmt.Printf("conns %d, %d B per write (k=%d frames of %d B): %d writes in %.1fs, writer CPU %.2fs: %.2f µs/write, %.2f µs/frame\n",
		conns, frame*k, k, frame, writes, wall.Seconds(), used.Seconds(), us/float64(writes), us/float64(writes*k))
	return nil
}

// cpu is this process's user + system CPU time so far.
func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
