package eventlog

import (
	"context"

	"github.com/parley-im/parley/store"
)

// Moderation changes of a group (docs/protocol.md §9). Each is checked by
// the store under the conversation's change lock before its seq is
// allocated (a refused request allocates nothing), appends an update
// event (or a leave, for removals) that fan-out delivers like any other
// event, and drops the affected users' membership cache entries in every
// process before it is answered, so a mute or removal applies to the
// next send on any gateway.

// SetRole gives user the role in conv (actor "" for the admin API).
func (l *Log) SetRole(ctx context.Context, conv, actor, device, user string, role store.Role) (store.UpdateResult, error) {
	return l.moderate(ctx, conv, actor, device, func(ch *store.MembershipChange) (store.UpdateResult, error) {
		return l.st.SetRole(ctx, ch, user, role)
	})
}

// MuteMember mutes user in conv until mutedUntil (unix ms; 0 unmutes).
func (l *Log) MuteMember(ctx context.Context, conv, actor, device, user string, mutedUntil int64) (store.UpdateResult, error) {
	return l.moderate(ctx, conv, actor, device, func(ch *store.MembershipChange) (store.UpdateResult, error) {
		return l.st.MuteMember(ctx, ch, user, mutedUntil)
	})
}

// Ban bans user from conv, removing it if it is a member.
func (l *Log) Ban(ctx context.Context, conv, actor, device, user string) (store.UpdateResult, error) {
	return l.moderate(ctx, conv, actor, device, func(ch *store.MembershipChange) (store.UpdateResult, error) {
		return l.st.Ban(ctx, ch, user)
	})
}

// Unban lifts user's ban from conv.
func (l *Log) Unban(ctx context.Context, conv, actor, device, user string) (store.UpdateResult, error) {
	return l.moderate(ctx, conv, actor, device, func(ch *store.MembershipChange) (store.UpdateResult, error) {
		return l.st.Unban(ctx, ch, user)
	})
}

// UpdateConv sets conv's title (if title is not nil) and invite policy
// (if invite is not "").
func (l *Log) UpdateConv(ctx context.Context, conv, actor, device string, title *string, invite string) (store.UpdateResult, error) {
	return l.moderate(ctx, conv, actor, device, func(ch *store.MembershipChange) (store.UpdateResult, error) {
		return l.st.UpdateConv(ctx, ch, title, invite)
	})
}

// RemoveMembers removes users from conv with one leave event (sender:
// actor). It returns the head after the change and the users removed
// (those who were members).
func (l *Log) RemoveMembers(ctx context.Context, conv, actor, device string, users []string) (int64, []string, error) {
	var head, members int64
	var removed []string
	err := l.change(ctx, conv, actor, func(ch *store.MembershipChange) (err error) {
		head, members, removed, err = l.st.RemoveMembers(ctx, ch, users)
		return err
	}, func(ch store.MembershipChange) {
		if len(removed) > 0 {
			l.changed(ctx, conv, removed)
			l.committed(ch, store.KindLeave, removed, device, members)
		}
	})
	return head, removed, err
}

// moderate runs one update change, then forgets its users everywhere and
// hands its events to fan-out.
func (l *Log) moderate(ctx context.Context, conv, actor, device string, apply func(*store.MembershipChange) (store.UpdateResult, error)) (store.UpdateResult, error) {
	var r store.UpdateResult
	err := l.change(ctx, conv, actor, func(ch *store.MembershipChange) (err error) {
		r, err = apply(ch)
		return err
	}, func(ch store.MembershipChange) {
		if r.Seq == 0 {
			return // nothing changed
		}
		if len(r.Users) > 0 {
			l.changed(ctx, conv, r.Users)
		}
		if l.onCommit == nil {
			return
		}
		members := r.Members
		if r.LeaveSeq != 0 {
			members++ // the update came before the removal
		}
		evs := []Committed{{Device: device, Members: members, Leaving: r.LeaveSeq != 0, Event: store.Event{Conv: conv, Seq: r.Seq, Kind: store.KindUpdate,
			Sender: actor, Ts: ch.Ts, Users: r.Users, Update: r.Update}}}
		if r.LeaveSeq != 0 {
			evs = append(evs, Committed{Device: device, Members: r.Members, Event: store.Event{Conv: conv, Seq: r.LeaveSeq, Kind: store.KindLeave,
				Sender: actor, Ts: ch.Ts, Users: r.Users}})
		}
		l.onCommit(evs)
	})
	if err == nil && r.Seq == 0 {
		r.Seq = r.Head // nothing changed: the reply carries the head
	}
	return r, err
}
