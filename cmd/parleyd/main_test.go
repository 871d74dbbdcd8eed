package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/parley-im/parley/config"
)

// TestReadyLine: the "parleyd ready" line names every listener, the
// WebSocket one as the URL a client connects to when ws_listen is set and
// as "off" when it is not.
func TestReadyLine(t *testing.T) {
	line := func(ws string) string {
		cfg := config.Default()
		cfg.Listen, cfg.WSListen, cfg.GatewayID = "127.0.0.1:7070", ws, "gw-1"
		var b bytes.Buffer
		slog.New(slog.NewTextHandler(&b, nil)).Info("parleyd ready", readyAttrs(cfg, "127.0.0.1:8081", "127.0.0.1:9090")...)
		return b.String()
	}
	for _, c := range []struct{ ws, want string }{
		{"", "websocket=off"},
		{"127.0.0.1:7071", "websocket=ws://127.0.0.1:7071/v1/ws"},
		{"0.0.0.0:7071", "websocket=ws://127.0.0.1:7071/v1/ws"},
		{":7071", "websocket=ws://127.0.0.1:7071/v1/ws"},
		{"[::1]:7071", "websocket=ws://[::1]:7071/v1/ws"},
	} {
		got := line(c.ws)
		for _, part := range []string{"msg=\"parleyd ready\"", "gateway=127.0.0.1:7070", "admin=http://127.0.0.1:8081", "metrics=127.0.0.1:9090", "gateway_id=gw-1", c.want} {
			if !strings.Contains(got, part) {
				t.Errorf("ws_listen %q: %q lacks %q", c.ws, got, part)
			}
		}
		if c.ws == "" && strings.Contains(got, "ws://") {
			t.Errorf("no ws_listen: %q names a WebSocket URL", got)
		}
	}
}
