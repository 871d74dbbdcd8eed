package main

import (
	"context"
	"fmt"
	"strconv"
)

type readResult struct {
	Conv   string `json:"conv"`
	Read   int64  `json:"read"`
	Unread int64  `json:"unread"`
}

func (r *readResult) text(*session) string {
	return fmt.Sprintf("%s: read %d, unread %d", r.Conv, r.Read, r.Unread)
}

func cmdRead(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	conv, seq, err := s.convAndPosition(ctx, cl.args())
	if err != nil {
		return nil, err
	}
	r, err := s.c.Read(ctx, conv, seq)
	if err != nil {
		return nil, err
	}
	return &readResult{Conv: conv, Read: r.Read, Unread: r.Unread}, nil
}

func isNumber(s string) bool {
	_, err := strconv.ParseInt(s, 10, 64)
	return err == nil
}

type ackResult struct {
	Conv      string `json:"conv"`
	Delivered int64  `json:"delivered"`
}

func (r *ackResult) text(*session) string {
	return fmt.Sprintf("%s: delivered %d (this device's cursor)", r.Conv, r.Delivered)
}

func cmdAck(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	if len(args) != 2 {
		return nil, needUsage()
	}
	seq, err := parseSeq(args[1])
	if err != nil {
		return nil, err
	}
	r, err := s.c.Ack(ctx, args[0], seq)
	if err != nil {
		return nil, err
	}
	return &ackResult{Conv: args[0], Delivered: r.Delivered}, nil
}

type recallResult struct {
	Conv   string `json:"conv"`
	Seq    int64  `json:"seq"`
	Target int64  `json:"target"`
}

func (r *recallResult) text(*session) string {
	return fmt.Sprintf("%s: recalled #%d (recall event #%d)", r.Conv, r.Target, r.Seq)
}

func cmdRecall(ctx context.Context, s *session, cl *cmdLine) (result, error) {
	args := cl.args()
	conv, at, err := s.convFirst(args, 1)
	if err != nil {
		return nil, err
	}
	if len(args)-at != 1 {
		return nil, needUsage()
	}
	seq, err := parseSeq(args[at])
	if err != nil {
		return nil, err
	}
	r, err := s.c.Recall(ctx, conv, seq)
	if err != nil {
		return nil, err
	}
	return &recallResult{Conv: conv, Seq: r.Seq, Target: r.Target}, nil
}
