package loadtest

import (
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/parley-im/parley/wire"
)

// Message features in the mixed scenario (docs/loadtest.md, "mixed"):
// typing frames before sends, edits of one's own messages, "delete for
// me" clears and receipts queries after reads. All are written without rid
// (fire-and-forget: the server answers only errors, which are counted by
// code), so they add the server's work and the frames they cause (edit
// pushes, typing and receipt frames, read_changed of clears) without
// changing how sends and reads are measured.

// featureMix is the mixed scenario's feature probabilities and counters.
type featureMix struct {
	// Static after setup.
	typingProb, editProb, clearProb, receiptsProb float64

	typing, edits, clears, receiptQueries atomic.Int64 // written
	typingIn, receiptsIn                  atomic.Int64 // typing and receipt frames received

	// Scenario typing: when each (conversation, user) last typed (clock
	// nanos), and how long its relayed frames took (nil in mixed).
	typedAt sync.Map // typingKey -> int64
	relay   *Hist
}

type typingKey struct{ conv, user string }

// typed records that user's device wrote a typing frame in conv at now.
func (f *featureMix) typed(conv, user string, now int64) {
	if f.relay != nil {
		f.typedAt.Store(typingKey{conv, user}, now)
	}
}

// relayed counts a typing frame received, and in scenario typing records
// how long after its user's last typing frame in that conversation.
func (f *featureMix) relayed(shard int, conv, user string, now int64) {
	f.typingIn.Add(1)
	if f.relay == nil {
		return
	}
	if at, ok := f.typedAt.Load(typingKey{conv, user}); ok {
		f.relay.Record(shard, now-at.(int64))
	}
}

// FeaturesReport is the feature part of the mixed report: what was sent
// and received over the whole run (warm-up included).
type FeaturesReport struct {
	TypingProb     float64 `json:"typing_prob"`   // of a typing frame before a send
	EditProb       float64 `json:"edit_prob"`     // of an edit after a send_ok
	ClearProb      float64 `json:"clear_prob"`    // of a clear after a read_ok (devices of single-device users)
	ReceiptsProb   float64 `json:"receipts_prob"` // of a receipts query after a read_ok of a direct conversation
	Typing         int64   `json:"typing"`
	Edits          int64   `json:"edits"`
	Clears         int64   `json:"clears"`
	ReceiptQueries int64   `json:"receipt_queries"`
	TypingIn       int64   `json:"typing_in"`   // typing frames received
	ReceiptsIn     int64   `json:"receipts_in"` // receipt frames received
}

func prob(p float64) bool { return p > 0 && rand.Float64() < p }

// beforeSend maybe writes a typing frame for conv (the user typed the
// message about to be sent).
func (c *Conn) beforeSend(conv string) {
	if f := c.r.features; f != nil && prob(f.typingProb) {
		f.typing.Add(1)
		c.fireAndForget(wire.Request{T: wire.TTyping, Conv: conv})
	}
}

// editBody is what an edit sets a message's body to.
var editBody = []byte("edited by parley-load")

// afterSendOK maybe edits the message just confirmed.
func (c *Conn) afterSendOK(conv string, seq int64) {
	if f := c.r.features; f != nil && prob(f.editProb) {
		f.edits.Add(1)
		c.fireAndForget(wire.Request{T: wire.TEdit, Conv: conv, Seq: seq, Body: editBody})
	}
}

// afterReadOK maybe clears conv up to what the device read and holds (a
// user with one device only: a clear hides events from the user's other
// devices too, which would then never receive the ones they had not
// yet), and maybe queries a direct conversation's receipts.
func (c *Conn) afterReadOK(conv string, read int64) {
	f := c.r.features
	if f == nil {
		return
	}
	if strings.HasPrefix(conv, "d.") && prob(f.receiptsProb) {
		f.receiptQueries.Add(1)
		c.fireAndForget(wire.Request{T: wire.TReceipts, Conv: conv})
	}
	m := c.r.mix
	if m == nil || m.devsOf[m.userOf[c.idx]] != 1 || !prob(f.clearProb) {
		return
	}
	ref, ok := c.routes[conv]
	if !ok || ref.i < 0 {
		return
	}
	if seq := min(read, ref.track.held(ref.i)); seq > 0 {
		f.clears.Add(1)
		c.fireAndForget(wire.Request{T: wire.TClear, Conv: conv, Seq: seq})
	}
}

// report returns the counters.
func (f *featureMix) report() *FeaturesReport {
	return &FeaturesReport{TypingProb: f.typingProb, EditProb: f.editProb, ClearProb: f.clearProb, ReceiptsProb: f.receiptsProb,
		Typing: f.typing.Load(), Edits: f.edits.Load(), Clears: f.clears.Load(), ReceiptQueries: f.receiptQueries.Load(),
		TypingIn: f.typingIn.Load(), ReceiptsIn: f.receiptsIn.Load()}
}
