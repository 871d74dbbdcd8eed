// Package client is Parley's reference Go client, written to be read by
// mobile client teams as much as to be used.
//
// Conn is one authenticated connection: requests carry a rid and wait for
// the reply with a timeout; server-initiated frames go to a callback.
// Client (client.go) builds the behaviour a real app needs on top of it:
// reconnect with jittered backoff, a resync of every conversation after
// each (re)connect, dedupe of events by (conv, seq), gap detection that
// triggers a sync, and acks of what the app has stored.
//
// Group moderation (docs/protocol.md §9) is a set of thin requests on
// both: SetRole, RemoveMembers, MuteMember, Ban, Unban and UpdateConv.
// What they change reaches every member as events through OnEvent: an
// "update" event (wire.KindUpdate, its fields in ev.Update) for roles,
// mutes, bans and group settings, and a "leave" for a removal. A leave
// that names this user ends the conversation for it like its own Leave:
// the conversation stays known and its history readable, and nothing
// newer arrives.
package client
