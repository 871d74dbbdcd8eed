package config

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestDocsListEveryKey fails when docs/config.md misses a key or states a
// default the code does not have.
func TestDocsListEveryKey(t *testing.T) {
	doc, err := os.ReadFile("../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range Keys() {
		row := "| `" + kv[0] + "` | `" + kv[1] + "` |"
		if !strings.Contains(string(doc), row) {
			t.Errorf("docs/config.md lacks the row %q", row)
		}
	}
}

func TestEnvOverridesFile(t *testing.T) {
	f := t.TempDir() + "/p.yaml"
	if err := os.WriteFile(f, []byte("listen: 127.0.0.1:1\nwrite_fanout_max: 5\nauth_timeout: 3s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(f, []string{"PARLEY_LISTEN=127.0.0.1:2", "PARLEY_MAX_BODY=100", "OTHER=x"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:2" || c.WriteFanoutMax != 5 || c.MaxBody != 100 || c.AuthTimeout != 3*time.Second {
		t.Fatalf("got %+v", c)
	}
	if c.OnlineFanoutMax != 2000 {
		t.Fatalf("default lost: %d", c.OnlineFanoutMax)
	}
}

func TestRejectsBadValues(t *testing.T) {
	if _, err := Load("", []string{"PARLEY_MAX_BODY=abc"}); err == nil {
		t.Fatal("non-numeric max_body accepted")
	}
	if _, err := Load("", []string{"PARLEY_WRITE_FANOUT_MAX=3000"}); err == nil {
		t.Fatal("write_fanout_max above online_fanout_max accepted")
	}
	f := t.TempDir() + "/p.yaml"
	_ = os.WriteFile(f, []byte("no_such_key: 1\n"), 0o600)
	if _, err := Load(f, nil); err == nil {
		t.Fatal("unknown key accepted")
	}
}

// TestNotifyTTLWithinFCMLimit: FCM refuses a ttl over 4 weeks, so
// notify_ttl may not exceed it.
func TestNotifyTTLWithinFCMLimit(t *testing.T) {
	if _, err := Load("", []string{"PARLEY_NOTIFY_TTL=673h"}); err == nil {
		t.Fatal("notify_ttl of 673h accepted")
	}
	if c, err := Load("", []string{"PARLEY_NOTIFY_TTL=672h"}); err != nil || c.NotifyTTL != 672*time.Hour {
		t.Fatalf("notify_ttl of 672h: %v", err)
	}
}
