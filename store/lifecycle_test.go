package store_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/test/testenv"
)

// TestProvisionDevices: batches of first logins create each user and
// device once, concurrent batches over the same ids included, and leave a
// device that exists under another user to that user.
func TestProvisionDevices(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := store.Open(ctx, testenv.PostgresURL(t), 8)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	const batches, per = 8, 256
	logins := make([][]store.NewLogin, batches)
	for b := range logins {
		for i := range per {
			// Every batch names the same 1,024 devices of 128 users, in another order.
			k := (i*7 + b*131) % (per * 4)
			logins[b] = append(logins[b], store.NewLogin{User: fmt.Sprintf("u%d", k%128), Device: fmt.Sprintf("d%d", k)})
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	for _, ls := range logins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := st.ProvisionDevices(ctx, ls); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d batches of %d first logins, concurrently: %v", batches, per, time.Since(start))
	ids := make([]string, per*4)
	for i := range ids {
		ids[i] = fmt.Sprintf("d%d", i)
	}
	devs, err := st.DevicesByID(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, d := range devs {
		seen[d.ID]++
		if want := fmt.Sprintf("u%d", mustAtoi(d.ID[1:])%128); d.User != want || d.InstallEpoch != 0 || len(d.TokenSHA256) != 0 || d.Revoked || d.Suspended {
			t.Errorf("%+v, want user %s", d, want)
		}
	}
	for _, ls := range logins {
		for _, l := range ls {
			if seen[l.Device] != 1 {
				t.Errorf("%s: %d rows", l.Device, seen[l.Device])
			}
		}
	}
	// A device of another user stays that user's.
	if err := st.ProvisionDevices(ctx, []store.NewLogin{{User: "thief", Device: "d0"}}); err != nil {
		t.Fatal(err)
	}
	if d, err := st.DeviceByID(ctx, "d0"); err != nil || d.User != "u0" {
		t.Fatalf("%+v %v", d, err)
	}
}

func mustAtoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
