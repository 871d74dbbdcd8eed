package conn

import (
	"context"

	"github.com/parley-im/parley/store"
	"github.com/parley-im/parley/wire"
)

// moderate serves role, member_mute, ban, unban and conv_update
// (docs/protocol.md §9): the store checks the caller's role under the
// conversation's change lock, and the answer carries the update event's
// seq (the head if nothing changed).
func (g *Gateway) moderate(ctx context.Context, s *Session, req *wire.Request) {
	var (
		r   store.UpdateResult
		err error
		log = g.deps.Log
	)
	switch req.T {
	case wire.TRole:
		role, _ := store.ParseRole(req.Role) // the decoder checked it
		r, err = log.SetRole(ctx, req.Conv, s.user, s.device, req.User, role)
	case wire.TMemberMute:
		r, err = log.MuteMember(ctx, req.Conv, s.user, s.device, req.User, req.MutedUntil)
	case wire.TBan:
		r, err = log.Ban(ctx, req.Conv, s.user, s.device, req.User)
	case wire.TUnban:
		r, err = log.Unban(ctx, req.Conv, s.user, s.device, req.User)
	case wire.TConvUpdate:
		var title *string
		if req.Has&wire.FTitle != 0 {
			title = &req.Title
		}
		r, err = log.UpdateConv(ctx, req.Conv, s.user, s.device, title, req.Invite)
	}
	g.answer(s, req, err, wire.UpdateOK{T: wire.TUpdateOK, Rid: req.Rid, Conv: req.Conv, Seq: r.Seq})
}

// membersRemove serves members_remove: one leave event for the users
// removed, answered with the head.
func (g *Gateway) membersRemove(ctx context.Context, s *Session, req *wire.Request) {
	head, _, err := g.deps.Log.RemoveMembers(ctx, req.Conv, s.user, s.device, req.Users)
	g.answer(s, req, err, wire.MembersOK{T: wire.TMembersOK, Rid: req.Rid, Conv: req.Conv, Head: head})
}
