package e2e_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/parley-im/parley/test/parleytest"
)

// TestBulkProvisioning provisions users and devices through the bulk admin
// API. The full figure (100,000 of each in under a minute) is measured by
// BenchmarkBulkProvision; this keeps the path tested at a smaller size.
func TestBulkProvisioning(t *testing.T) {
	t.Parallel()
	env := parleytest.Start(t, parleytest.Config(t))
	provision(t, env, 2000)
	var out map[string]any
	if st := env.Admin(t, "POST", "/v1/bulk/users", map[string]any{"ids": []string{"u0"}}, &out); st != http.StatusConflict || out["code"] != "EXISTS" {
		t.Fatalf("existing id: %d %v", st, out)
	}
	if st := env.Admin(t, "POST", "/v1/bulk/devices", map[string]any{"devices": []map[string]string{{"id": "x", "user": "nobody"}}}, &out); st != http.StatusNotFound {
		t.Fatalf("unknown user: %d %v", st, out)
	}
}

func provision(t testing.TB, env *parleytest.Env, n int) {
	ids := make([]string, n)
	devs := make([]map[string]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("u%d", i)
		devs[i] = map[string]string{"id": fmt.Sprintf("u%d-d1", i), "user": ids[i]}
	}
	if st := env.Admin(t, "POST", "/v1/bulk/users", map[string]any{"ids": ids}, nil); st != http.StatusCreated {
		t.Fatalf("bulk users: %d", st)
	}
	var out struct {
		Devices []struct{ ID, User, Token string }
	}
	if st := env.Admin(t, "POST", "/v1/bulk/devices", map[string]any{"devices": devs}, &out); st != http.StatusCreated || len(out.Devices) != n || out.Devices[0].Token == "" {
		t.Fatalf("bulk devices: %d, %d devices", st, len(out.Devices))
	}
}

// BenchmarkBulkProvision/users=100000 provisions 100,000 users and 100,000
// devices per iteration (go test -run '^$' -bench BulkProvision -benchtime 1x ./server/).
func BenchmarkBulkProvision(b *testing.B) {
	b.Run("users=100000", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			env := parleytest.Start(b, parleytest.Config(b))
			b.StartTimer()
			start := time.Now()
			provision(b, env, 100000)
			b.ReportMetric(time.Since(start).Seconds(), "s/100k")
		}
	})
}
