// Package client is Parley's reference Go client, written to be read by
// mobile client teams as much as to be used.
//
// Conn is one authenticated connection: requests carry a rid and wait for
// the reply with a timeout; server-initiated frames go to a callback.
// Client (client.go) builds the behaviour a real app needs on top of it:
// reconnect with jittered backoff, a resync of every conversation after
// each (re)connect, dedupe of events by (conv, seq), gap detection that
// triggers a sync, and acks of what the app has stored.
package client
