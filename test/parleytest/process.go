package parleytest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/test/testenv"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// Binary builds cmd/parleyd once per test binary, with -race when the
// test binary has it, and returns its path.
//
// Every test binary of one checkout builds to the same path, under a lock:
// go build leaves a binary that is up to date alone, so the first package
// links parleyd and the others (go test runs several at once) reuse it
// instead of each linking its own copy.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() { binPath, buildErr = build() })
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func build() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	name := "parleyd"
	args := []string{"build"}
	if raceBuild {
		name, args = "parleyd-race", append(args, "-race")
	}
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(os.TempDir(), "parley-test-bin-"+hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, name+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	path := filepath.Join(dir, name)
	cmd := exec.Command("go", append(args, "-o", path, "./cmd/parleyd")...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return path, nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod not found")
		}
		dir = parent
	}
}

// Process is a parleyd running as its own process.
type Process struct {
	Cfg      config.Config
	Addr     string
	AdminURL string
	cmd      *exec.Cmd
	done     chan struct{}
	logPath  string
}

// StartProcess runs parleyd as a child process with cfg (every key passed
// as a PARLEY_* variable) on fresh ports, and waits until it is ready.
func StartProcess(t testing.TB, cfg config.Config) *Process {
	t.Helper()
	cfg.Listen = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cfg.AdminListen = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cfg.MetricsListen = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	if cfg.GatewayID == "" {
		cfg.GatewayID = "gwp-" + strings.Split(cfg.Listen, ":")[1]
	}
	p := &Process{Cfg: cfg, Addr: cfg.Listen, AdminURL: "http://" + cfg.AdminListen, done: make(chan struct{})}
	p.logPath = filepath.Join(t.TempDir(), "parleyd.log")
	logf, err := os.Create(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(Binary(t))
	p.cmd.Env = append(os.Environ(), envOf(cfg)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); logf.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.Kill()
		b, _ := os.ReadFile(p.logPath)
		if i := strings.Index(string(b), "WARNING: DATA RACE"); i >= 0 {
			t.Errorf("parleyd %s found a data race:\n%s", cfg.GatewayID, string(b[i:]))
		} else if t.Failed() {
			t.Logf("parleyd %s log:\n%s", cfg.GatewayID, tailLines(string(b), 40))
		}
	})
	ready := "http://" + cfg.MetricsListen + "/readyz"
	testenv.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		select {
		case <-p.done:
			b, _ := os.ReadFile(p.logPath)
			t.Fatalf("parleyd exited during start:\n%s", b)
		default:
		}
		resp, err := http.Get(ready)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("readyz: %d", resp.StatusCode)
		}
		return nil
	})
	return p
}

// Kill sends SIGKILL and waits for the process to exit.
func (p *Process) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM (graceful shutdown) and waits up to timeout.
func (p *Process) Stop(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		p.Kill()
		return context.DeadlineExceeded
	}
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// envOf renders cfg as PARLEY_* variables.
func envOf(cfg config.Config) []string {
	v := reflect.ValueOf(cfg)
	var env []string
	for i := 0; i < v.NumField(); i++ {
		key := "PARLEY_" + strings.ToUpper(v.Type().Field(i).Tag.Get("yaml"))
		f := v.Field(i)
		val := fmt.Sprint(f.Interface())
		if d, ok := f.Interface().(time.Duration); ok {
			val = d.String()
		}
		env = append(env, key+"="+val)
	}
	return env
}

func tailLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
