package main

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/parley-im/parley/wire"
)

// The JSON of an event (open, snapshot, watch -json) carries every key of
// the event map (docs/protocol.md §3) with its value: an event with every
// key set prints every key.
func TestEventJSONHasEveryKey(t *testing.T) {
	mu, banned, title := int64(1735689600999), true, "Trip"
	ev := wire.Event{Seq: 7, Kind: wire.KindMsg, Sender: "ana", Body: []byte("hi"), Ts: 1735689600123, Cmid: "c1",
		Recalled: true, Target: 3, Users: []string{"ben"}, Mentions: []string{"cy", "dee"}, Edited: 1735689600456,
		Update: wire.Update{Role: wire.RoleAdmin, MutedUntil: &mu, Banned: &banned, Title: &title, Invite: wire.InviteAdmins}}
	b, err := wire.Marshal(&ev)
	if err != nil {
		t.Fatal(err)
	}
	var wireMap map[string]any
	if err := msgpack.Unmarshal(b, &wireMap); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(eventJSON(ev))
	if err != nil {
		t.Fatal(err)
	}
	var jsonMap map[string]any
	if err := json.Unmarshal(js, &jsonMap); err != nil {
		t.Fatal(err)
	}
	var wk, jk []string
	for k := range wireMap {
		wk = append(wk, k)
	}
	for k := range jsonMap {
		jk = append(jk, k)
	}
	slices.Sort(wk)
	slices.Sort(jk)
	if !slices.Equal(wk, jk) {
		t.Fatalf("JSON keys %v, want the event map's %v", jk, wk)
	}
	if got := jsonMap["mentions"]; !reflect.DeepEqual(got, []any{"cy", "dee"}) {
		t.Errorf("mentions: %v", got)
	}
	if jsonMap["body"] != "hi" {
		t.Errorf("body: %v", jsonMap["body"])
	}
}
