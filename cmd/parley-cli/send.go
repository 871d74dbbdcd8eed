package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

type sendResult struct {
	Conv string `json:"conv"`
	Cmid string `json:"cmid"`
	Seq  int64  `json:"seq"`
	Ts   int64  `json:"ts"`
	Dup  bool   `json:"dup,omitempty"`
}

func (r *sendResult) text(s *session) string {
	if r.Dup {
		return fmt.Sprintf("sent earlier: %s #%d (dup)", r.Conv, r.Seq)
	}
	return fmt.Sprintf("sent: %s #%d", r.Conv, r.Seq)
}

func newCmid() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "cli-" + hex.EncodeToString(b[:])
}

func cmdSend(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	conv, at, err := s.convFirst(cl.args(), 1)
	if err != nil {
		return nil, err
	}
	text := cl.rest(at)
	cmid := newCmid()
	r, err := s.c.Send(ctx, conv, cmid, []byte(text))
	if err != nil {
		return nil, err
	}
	return &sendResult{Conv: conv, Cmid: cmid, Seq: r.Seq, Ts: r.Ts, Dup: r.Dup}, nil
}
