//go:build linux

package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresServer is a private PostgreSQL server owned by one test, started by
// StartPostgres, for tests that stop, restart or kill the database. Its data
// survive Stop/Start, Restart and Kill/Start (crash recovery); a t.Cleanup
// stops it and t.TempDir removes the data.
//
// The postmaster runs as a direct child of the test binary (as OS user
// postgres, in its own process group, with a parent-death signal), not
// through pg_ctl: Stop sends it SIGINT, which is what `pg_ctl stop -m fast`
// does, and Kill can SIGKILL exactly that process. Its methods call t.Fatal
// on failure, so call them from the test's goroutine.
type PostgresServer struct {
	t        testing.TB
	bin      string // directory of initdb and postgres
	dir      string // owned by postgres: data/, postgres.log
	data     string
	sockDir  string
	port     int
	log      string
	uid, gid uint32

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// PostgresDatabase is the database StartPostgres creates; URL points at it.
const PostgresDatabase = "parley"

// postgresBinDirs are searched, in order, for initdb and postgres (Debian
// keeps them off PATH).
var postgresBinDirs = []string{
	"/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin",
	"/usr/lib/postgresql/14/bin", "/usr/lib/postgresql/13/bin",
}

// StartPostgres initializes a fresh cluster in a t.TempDir (initdb as OS user
// postgres, --auth=trust --no-sync), starts it on a free port of 127.0.0.1
// with fsync=off and its unix socket in the temp dir, creates the database
// "parley" and returns once it accepts connections. The test must run as
// root (to run the server as postgres) or as postgres.
func StartPostgres(t testing.TB) *PostgresServer {
	t.Helper()
	bin, err := findPostgresBin()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	s := &PostgresServer{t: t, bin: bin}
	if err := s.lookupUser(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	s.dir = t.TempDir() // removed after the Cleanup below has stopped the server
	// t.TempDir's parent is 0700 and root's: let postgres through.
	if err := os.Chmod(filepath.Dir(s.dir), 0o711); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if err := os.Chown(s.dir, int(s.uid), int(s.gid)); err != nil {
		t.Fatalf("testenv: chown %s to postgres: %v", s.dir, err)
	}
	s.data = filepath.Join(s.dir, "data")
	s.log = filepath.Join(s.dir, "postgres.log")
	s.sockDir = s.dir
	// A unix socket path is limited to 107 bytes.
	if len(s.sockDir)+len("/.s.PGSQL.65535") > 100 {
		short, err := os.MkdirTemp("", "pgs")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(short) })
		if err := os.Chown(short, int(s.uid), int(s.gid)); err != nil {
			t.Fatal(err)
		}
		s.sockDir = short
	}
	t.Cleanup(func() {
		s.stop(true)
		if t.Failed() {
			t.Logf("testenv: private PostgreSQL on port %d, end of its log:\n%s", s.port, tail(s.log, 20))
		}
	})

	out, err := s.command(filepath.Join(bin, "initdb"), "-D", s.data, "--auth=trust", "--no-sync",
		"-U", "postgres", "-E", "UTF8", "--locale=C").CombinedOutput()
	if err != nil {
		t.Fatalf("testenv: initdb: %v\n%s", err, out)
	}

	// Another process may take the port between FreePort and the bind: retry.
	var lastErr error
	for range 5 {
		s.port = FreePort(t)
		if lastErr = s.start(); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		t.Fatalf("testenv: starting PostgreSQL: %v", lastErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.urlOf("postgres"))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+PostgresDatabase); err != nil {
		t.Fatalf("testenv: CREATE DATABASE %s: %v", PostgresDatabase, err)
	}
	return s
}

// URL is the URL of the database "parley" as user postgres over TCP (trust
// authentication, no password).
func (s *PostgresServer) URL() string { return s.urlOf(PostgresDatabase) }

func (s *PostgresServer) urlOf(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// Port is the server's TCP port on 127.0.0.1 (kept across restarts).
func (s *PostgresServer) Port() int { return s.port }

// Dir is the directory holding the data directory and the server log.
func (s *PostgresServer) Dir() string { return s.dir }

// Pid is the postmaster's process id, or 0 while it is not running.
func (s *PostgresServer) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Stop shuts the server down as `pg_ctl stop -m fast` does (SIGINT: open
// transactions are rolled back, clients disconnected) and waits until it has
// exited. Stopping a server that is not running does nothing.
func (s *PostgresServer) Stop() {
	s.t.Helper()
	if err := s.stop(false); err != nil {
		s.t.Fatalf("testenv: stopping PostgreSQL on port %d: %v", s.port, err)
	}
}

// Start starts a stopped (or killed) server again on the same port, running
// crash recovery if it was killed, and waits until it accepts connections.
// Starting a running server does nothing.
func (s *PostgresServer) Start() {
	s.t.Helper()
	s.mu.Lock()
	running := s.cmd != nil
	s.mu.Unlock()
	if running {
		return
	}
	if err := s.start(); err != nil {
		s.t.Fatalf("testenv: starting PostgreSQL on port %d: %v", s.port, err)
	}
}

// Restart is Stop then Start.
func (s *PostgresServer) Restart() {
	s.t.Helper()
	s.Stop()
	s.Start()
}

// Kill sends SIGKILL to the postmaster, as a crash would, and waits until it
// and its backends are gone (a backend still running when the postmaster
// has exited is killed too, so that Start can reuse the shared memory).
// Start then runs crash recovery. Killing a server that is not running does
// nothing.
func (s *PostgresServer) Kill() {
	s.t.Helper()
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	// Each backend makes itself a process group leader (setsid), so the
	// postmaster's group does not hold them: they are its children until
	// it dies. One still attached to the shared memory when Start runs
	// makes the new postmaster refuse to start.
	kids := childrenOf(cmd.Process.Pid)
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
	err := reapGroup(cmd.Process.Pid, time.Second)
	if err == nil {
		err = reapPids(kids, time.Second)
	}
	if err != nil {
		s.t.Fatalf("testenv: killing PostgreSQL on port %d: %v", s.port, err)
	}
}

// start launches the postmaster on s.port and waits until it accepts
// connections to the postgres database.
func (s *PostgresServer) start() error {
	cmd := s.command(filepath.Join(s.bin, "postgres"), "-D", s.data,
		"-p", strconv.Itoa(s.port),
		"-k", s.sockDir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off",
		"-c", "full_page_writes=off",
		"-c", "shared_buffers=32MB",
		"-c", "max_connections=100",
		"-c", "max_wal_size=256MB",
		"-c", "logging_collector=off",
		"-c", "log_min_messages=warning",
		"-c", "log_line_prefix=%m [%p] ",
	)
	done, err := launch(cmd, s.log)
	if err != nil {
		return err
	}
	_ = os.Chown(s.log, int(s.uid), int(s.gid))
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	err = waitReady(fmt.Sprintf("postgres on port %d", s.port), cmd, done, s.log, s.ping)
	if _, exited := err.(errExited); exited {
		s.mu.Lock()
		s.cmd, s.done = nil, nil
		s.mu.Unlock()
		_ = reapGroup(cmd.Process.Pid, 0)
	} else if err != nil {
		s.stop(true)
	}
	return err
}

// ping connects to the postgres database once.
func (s *PostgresServer) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.urlOf("postgres"))
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// stop shuts the server down (fast shutdown; SIGKILL if force and it does
// not exit in time) and waits for it.
func (s *PostgresServer) stop(force bool) error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	var err error
	select {
	case <-done:
	case <-time.After(setupTimeout):
		err = fmt.Errorf("no exit %v after SIGINT", setupTimeout)
		if !force {
			return err
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
	s.mu.Lock()
	if s.cmd == cmd {
		s.cmd, s.done = nil, nil
	}
	s.mu.Unlock()
	if rerr := reapGroup(cmd.Process.Pid, 0); err == nil {
		err = rerr
	}
	return err
}

// command returns cmd running as OS user postgres in a process group of its
// own, killed by the kernel if the test binary dies first.
func (s *PostgresServer) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = s.dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C", "LC_ALL=C", "HOME=" + s.dir, "PGTZ=UTC"}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:   true,
		Pdeathsig: syscall.SIGKILL, // set after the uid change, so it holds
	}
	if uint32(os.Geteuid()) != s.uid {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: s.uid, Gid: s.gid}
	}
	return cmd
}

func (s *PostgresServer) lookupUser() error {
	if os.Geteuid() != 0 {
		// Not root: the server must run as ourselves (initdb refuses root,
		// not other users).
		s.uid, s.gid = uint32(os.Geteuid()), uint32(os.Getegid())
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("StartPostgres runs the server as OS user postgres: %v (install the Debian package postgresql)", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	s.uid, s.gid = uint32(uid), uint32(gid)
	return nil
}

func findPostgresBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := os.Stat(filepath.Join(filepath.Dir(p), "postgres")); err == nil {
			return filepath.Dir(p), nil
		}
	}
	for _, d := range postgresBinDirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("PostgreSQL server binaries (initdb, postgres) not found on PATH nor under /usr/lib/postgresql/*/bin; " +
		"`make services` installs them (Debian package postgresql)")
}

// reapGroup waits until no live (non-zombie) process is left in process
// group pgid (the postmaster's backends), SIGKILLing the stragglers after
// a grace period. On Linux it reads /proc; elsewhere it does nothing.
func reapGroup(pgid int, grace time.Duration) error {
	return reap(func() []int { return groupMembers(pgid) }, func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) },
		fmt.Sprintf("of group %d", pgid), grace)
}

// reapPids waits until none of pids is alive (or a zombie), SIGKILLing
// the stragglers after a grace period.
func reapPids(pids []int, grace time.Duration) error {
	alive := func() []int { return livePids(func(p proc) bool { return slices.Contains(pids, p.pid) }) }
	kill := func() {
		for _, pid := range alive() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return reap(alive, kill, "", grace)
}

// reap waits until alive returns none, calling kill once after grace
// (default 3 s) and failing if some survive setupTimeout more.
func reap(alive func() []int, kill func(), what string, grace time.Duration) error {
	if grace <= 0 {
		grace = 3 * time.Second
	}
	deadline := time.Now().Add(grace)
	killed := false
	for {
		left := alive()
		if len(left) == 0 {
			return nil
		}
		if !killed && time.Now().After(deadline) {
			kill()
			killed = true
			deadline = time.Now().Add(setupTimeout)
		} else if killed && time.Now().After(deadline) {
			return fmt.Errorf("processes %v %s survive SIGKILL", left, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// childrenOf lists the live processes whose parent is ppid.
func childrenOf(ppid int) []int { return livePids(func(p proc) bool { return p.ppid == ppid }) }

// groupMembers lists the processes of group pgid that are not zombies.
func groupMembers(pgid int) []int { return livePids(func(p proc) bool { return p.pgrp == pgid }) }

// livePids lists the pids of the live processes that match.
func livePids(match func(proc) bool) []int {
	var out []int
	for _, p := range procs() {
		if match(p) {
			out = append(out, p.pid)
		}
	}
	return out
}

// proc is one live process as /proc/PID/stat shows it.
type proc struct{ pid, ppid, pgrp int }

// procs lists the processes that are not zombies (none without /proc).
func procs() []proc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp …; comm may hold spaces and parens.
		rest := string(b)
		if i := strings.LastIndexByte(rest, ')'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		ppid, err1 := strconv.Atoi(f[1])
		pgrp, err2 := strconv.Atoi(f[2])
		if err1 == nil && err2 == nil {
			out = append(out, proc{pid: pid, ppid: ppid, pgrp: pgrp})
		}
	}
	return out
}
