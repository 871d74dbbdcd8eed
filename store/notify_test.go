package store_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/parley-im/parley/store"
)

// NotifyTargets reads many events of one conversation together; each
// event still gets exactly the registered devices of the users whose
// membership periods contain its seq (not the sender; only the mentioned
// users for a mentions-only event), with their cursors and mutes.
func TestNotifyTargets(t *testing.T) {
	t.Parallel()
	env, st, ctx := startStore(t)
	env.Group(t, "g", "ana", "ben", "cy") // seq 1
	env.Group(t, "h", "ana", "ben")       // seq 1
	conn := pgConn(t, ctx, env)
	// In g: ben leaves after seq 3 and is back from seq 5; cy joins at 4.
	for _, q := range []string{
		`UPDATE membership_periods SET to_seq = 3 WHERE conv_id = 'g' AND user_id = 'ben'`,
		`INSERT INTO membership_periods (conv_id, user_id, from_seq) VALUES ('g', 'ben', 5)`,
		`UPDATE membership_periods SET from_seq = 4 WHERE conv_id = 'g' AND user_id = 'cy'`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var msgs []store.NewMessage
	for seq := int64(2); seq <= 6; seq++ {
		m := store.NewMessage{Conv: "g", Sender: "ana", Cmid: fmt.Sprint("g", seq), Body: []byte("x"), Seq: seq, Ts: 1000 + seq}
		if seq == 6 {
			m.Mentions = []string{"cy"}
		}
		msgs = append(msgs, m)
	}
	msgs = append(msgs, store.NewMessage{Conv: "h", Sender: "ben", Cmid: "h2", Body: []byte("y"), Seq: 2, Ts: 1002})
	if _, err := st.InsertMessages(ctx, msgs, 100); err != nil {
		t.Fatal(err)
	}
	devs := map[string]string{} // user → device
	rows, err := conn.Query(ctx, `SELECT user_id, device_id FROM devices`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var u, d string
		if err := rows.Scan(&u, &d); err != nil {
			t.Fatal(err)
		}
		devs[u] = d
	}
	if rows.Err() != nil || len(devs) != 3 {
		t.Fatalf("devices %v (%v)", devs, rows.Err())
	}
	for _, u := range []string{"ana", "ben", "cy"} {
		if _, err := st.RegisterNotify(ctx, store.Registration{Device: devs[u], User: u, Provider: "webhook", Token: "t-" + u, RegisteredAt: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `INSERT INTO conv_settings (user_id, conv_id, muted_until) VALUES ('cy', 'g', 99)`); err != nil {
		t.Fatal(err)
	}
	evs := []store.NotifyEvent{{Conv: "g", Seq: 2}, {Conv: "g", Seq: 3}, {Conv: "h", Seq: 2}, {Conv: "g", Seq: 4},
		{Conv: "g", Seq: 5}, {Conv: "g", Seq: 6, MentionsOnly: true}, {Conv: "g", Seq: 1}}
	got, err := st.NotifyTargets(ctx, evs)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, tg := range got {
		e := evs[tg.Event]
		seen = append(seen, fmt.Sprintf("%s/%d:%s", e.Conv, e.Seq, tg.Reg.User))
		if tg.Reg.Device != devs[tg.Reg.User] || tg.Reg.Token != "t-"+tg.Reg.User || tg.Ts != 1000+e.Seq {
			t.Errorf("target %+v of %+v", tg, e)
		}
		if want := tg.Reg.User == "cy" && e.Conv == "g"; (tg.MutedUntil == 99) != want {
			t.Errorf("muted_until %d for %s in %s", tg.MutedUntil, tg.Reg.User, e.Conv)
		}
		if tg.Mentioned != (e.Seq == 6 && e.Conv == "g") {
			t.Errorf("mentioned %v for %s at %s/%d", tg.Mentioned, tg.Reg.User, e.Conv, e.Seq)
		}
	}
	slices.Sort(seen)
	// g/1 is the group's creation, not a msg: nobody.
	want := []string{"g/2:ben", "g/3:ben", "g/4:cy", "g/5:ben", "g/5:cy", "g/6:cy", "h/2:ana"}
	if !slices.Equal(seen, want) {
		t.Fatalf("targets %v, want %v", seen, want)
	}
}

// A provider's "bad token" removes the registration the notification was
// sent with, not one the device made since: with another token, or with
// the same token again (the app was handed it anew).
func TestDropNotifyTokenKeepsNewerRegistration(t *testing.T) {
	t.Parallel()
	env, st, ctx := startStore(t)
	dev := env.User(t, "drop-tokens")
	reg := func(token string, at int64) {
		t.Helper()
		if _, err := st.RegisterNotify(ctx, store.Registration{Device: dev.ID, User: dev.User, Provider: "webhook", Token: token, RegisteredAt: at}); err != nil {
			t.Fatal(err)
		}
	}
	registered := func() []store.Registration {
		t.Helper()
		rs, err := st.UserRegistrations(ctx, dev.User)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	drop := func(token string, at int64, want bool) {
		t.Helper()
		got, err := st.DropNotifyToken(ctx, dev.ID, token, at)
		if err != nil || got != want {
			t.Fatalf("drop %s registered at %d: %v, %v; want %v", token, at, got, err, want)
		}
	}
	// The same token registered again after the send read it: kept.
	reg("t1", 1000)
	reg("t1", 2000)
	drop("t1", 1000, false)
	if rs := registered(); len(rs) != 1 || rs[0].Token != "t1" || rs[0].RegisteredAt != 2000 {
		t.Fatalf("after a stale drop of the same token: %+v", rs)
	}
	// Another token registered since: kept.
	reg("t2", 3000)
	drop("t1", 2000, false)
	if rs := registered(); len(rs) != 1 || rs[0].Token != "t2" {
		t.Fatalf("after a drop of the old token: %+v", rs)
	}
	// The registration the send used: removed.
	drop("t2", 3000, true)
	if rs := registered(); len(rs) != 0 {
		t.Fatalf("after dropping the registration used: %+v", rs)
	}
}
