package wire

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func BenchmarkAppendFrame(b *testing.B) {
	push := &Push{T: TPush, Conv: "conv-0123456789", EventFields: Event{Seq: 123456, Kind: KindMsg,
		Sender: "user-42", Body: bytes.Repeat([]byte("x"), 100), Ts: 1735689600123, Cmid: "cmid-0001"}}
	events := make([]Event, 20)
	for i := range events {
		events[i] = push.Event()
		events[i].Seq += int64(i)
	}
	for _, bc := range []struct {
		name string
		v    any
	}{
		{"push-100B", push},
		{"send_ok", &SendOK{T: TSendOK, Rid: "r-17", Conv: "conv-0123456789", Cmid: "cmid-0001", Seq: 123456, Ts: 1735689600123}},
		{"error", &ErrorFrame{T: TError, Rid: "r-17", Code: NotMember, Msg: "not a member"}},
		{"sync_ok-20x100B", &SyncOK{T: TSyncOK, Rid: "r", Conv: "conv-0123456789", Epoch: 1, Head: 200, MinSeq: 1, Upto: 120, More: true, Events: events}},
		{"request-send-100B", &Request{T: TSend, Rid: "r-17", Conv: "conv-0123456789", Cmid: "cmid-0001", Body: push.Body}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, 4096)
			for b.Loop() {
				var err error
				buf, err = AppendFrame(buf[:0], bc.v)
				if err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(len(buf)))
		})
	}
}

func BenchmarkDecodeRequest(b *testing.B) {
	for _, bc := range []struct {
		name string
		q    Request
	}{
		{"send-100B", Request{T: TSend, Rid: "r-17", Conv: "conv-0123456789", Cmid: "cmid-0001", Body: bytes.Repeat([]byte("x"), 100)}},
		{"ack", Request{T: TAck, Conv: "conv-0123456789", Seq: 123456}},
		{"ping", Request{T: TPing}},
	} {
		body, err := Marshal(&bc.q)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := DecodeRequest(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	// muted_until as a float64, as JavaScript's encoders write it.
	body, err := msgpack.Marshal(map[string]any{"t": TConvSettings, "conv": "conv-0123456789", "muted_until": float64(1735689600123)})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("conv_settings-float64", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if q, err := DecodeRequest(body); err != nil || q.MutedUntil != 1735689600123 {
				b.Fatal(q, err)
			}
		}
	})
}

func BenchmarkDecodeMessage(b *testing.B) {
	push := Push{T: TPush, Conv: "conv-0123456789", EventFields: Event{Seq: 123456, Kind: KindMsg,
		Sender: "user-42", Body: bytes.Repeat([]byte("x"), 100), Ts: 1735689600123, Cmid: "cmid-0001"}}
	body, _ := Marshal(&push)
	b.Run("push-100B", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeMessage(body); err != nil {
				b.Fatal(err)
			}
		}
	})
}
