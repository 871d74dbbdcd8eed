package eventlog

import (
	"context"
	"testing"
	"time"
)

// BenchmarkSendCheck is what a send pays before its seq is allocated to
// learn that its sender may post: a membership cache hit, and the
// membership-and-mute check the gateway runs (mayPost). Entries are
// cached (a sender who keeps sending hits the cache; misses go to
// PostgreSQL and are counted by MemberLookups instead).
func BenchmarkSendCheck(b *testing.B) {
	m := newMemberCache(nil, time.Hour, time.Second, MemberLookups{}, nil)
	m.entries[memberKey{"ana", "g"}] = &memberEntry{exp: time.Now().Add(time.Hour), used: true, mutedUntil: time.Now().Add(-time.Minute).UnixMilli()}
	l := &Log{members: m, now: time.Now}
	ctx := context.Background()
	b.Run("member", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if ok, err := m.isMember(ctx, "ana", "g"); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	})
	b.Run("member-and-mute", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := l.mayPost(ctx, "ana", "g"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
