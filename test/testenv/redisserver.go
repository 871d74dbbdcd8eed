package testenv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisServer is a private redis-server process owned by one test, started by
// StartRedis. It keeps no data on disk: after Kill and Restart it is empty.
// Its methods call t.Fatal on failure, so call them from the test's goroutine.
type RedisServer struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	log  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// StartRedis starts a private redis-server (found on PATH or in /usr/bin) on a
// free port of 127.0.0.1, without persistence (--save "" --appendonly no) and
// with its files in a t.TempDir, waits until it answers PING, and registers a
// t.Cleanup that kills it.
func StartRedis(t testing.TB) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		bin = "/usr/bin/redis-server"
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("testenv: redis-server is not installed (not on PATH, not in /usr/bin); " +
				"`make services` installs it (Debian package redis-server)")
		}
	}
	dir := t.TempDir() // removed after the Cleanup below has killed the server
	s := &RedisServer{t: t, bin: bin, dir: dir, log: filepath.Join(dir, "redis.log")}
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			t.Logf("testenv: private redis-server on %s, end of its log:\n%s", s.Addr(), tail(s.log, 20))
		}
	})

	// Another process may take the port between FreePort and the bind: retry.
	var lastErr error
	for range 5 {
		s.port = FreePort(t)
		if lastErr = s.start(); lastErr == nil {
			return s
		}
	}
	t.Fatalf("testenv: starting redis-server: %v", lastErr)
	return nil
}

// URL returns the server's URL, redis://127.0.0.1:PORT/0.
func (s *RedisServer) URL() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", s.port) }

// Addr returns the server's address, 127.0.0.1:PORT.
func (s *RedisServer) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// Port returns the server's TCP port.
func (s *RedisServer) Port() int { return s.port }

// Kill kills the server with SIGKILL and waits until it has exited. Killing a
// server that is not running does nothing.
func (s *RedisServer) Kill() {
	s.t.Helper()
	s.stop()
}

// Restart starts the server again on the same port, empty, and waits until it
// answers PING. A server still running is killed first.
func (s *RedisServer) Restart() {
	s.t.Helper()
	s.stop()
	if err := s.start(); err != nil {
		s.t.Fatalf("testenv: restarting redis-server on %s: %v", s.Addr(), err)
	}
}

// Flush deletes every key of the server (FLUSHALL).
func (s *RedisServer) Flush() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	c := s.client()
	defer c.Close()
	if err := c.FlushAll(ctx).Err(); err != nil {
		s.t.Fatalf("testenv: FLUSHALL on %s: %v", s.Addr(), err)
	}
}

func (s *RedisServer) client() *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:        s.Addr(),
		DialTimeout: time.Second,
		MaxRetries:  -1,
	})
}

// start launches redis-server on s.port and waits for PING.
func (s *RedisServer) start() error {
	// With --save '' nothing writes a dump, unless a test ran SAVE: make sure
	// a restart comes up empty anyway.
	os.Remove(filepath.Join(s.dir, "dump.rdb"))
	os.RemoveAll(filepath.Join(s.dir, "appendonlydir"))

	cmd := exec.Command(s.bin,
		"--port", fmt.Sprint(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--logfile", "", // log to stdout, which is the log file
	)
	cmd.Dir = s.dir
	setDeathSignal(cmd)
	done, err := launch(cmd, s.log)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	err = waitReady(fmt.Sprintf("redis-server on port %d", s.port), cmd, done, s.log, func() error { return ping(s.Addr()) })
	if err != nil {
		if _, exited := err.(errExited); !exited {
			s.stop()
		}
		return err
	}
	return nil
}

// ping sends one PING over a fresh connection. (Not go-redis: its pool logs
// every refused dial while the server starts.)
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// stop kills the process if it runs and waits for it to exit.
func (s *RedisServer) stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-done
}

// tail returns the last n lines of a file, for messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
