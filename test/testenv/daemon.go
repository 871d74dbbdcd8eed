package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"time"
)

// launch starts a server process with its output appended to logPath and
// returns a channel that is closed when it has exited.
func launch(cmd *exec.Cmd, logPath string) (chan struct{}, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own copy
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	return done, nil
}

// errExited is waitReady's error for a process that exited while starting.
type errExited struct{ msg string }

func (e errExited) Error() string { return e.msg }

// waitReady polls ready every 10 ms until it succeeds. It fails with
// errExited if the process (done) exits first, or with the last ready error
// once setupTimeout has passed; what names the server in the error.
func waitReady(what string, cmd *exec.Cmd, done <-chan struct{}, logPath string, ready func() error) error {
	deadline := time.Now().Add(setupTimeout)
	for {
		select {
		case <-done:
			return errExited{fmt.Sprintf("%s exited at start-up (%v); its log:\n%s", what, cmd.ProcessState, tail(logPath, 20))}
		default:
		}
		err := ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is not ready after %v: %w", what, setupTimeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
