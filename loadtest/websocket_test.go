package loadtest

import (
	"testing"
	"time"

	"github.com/parley-im/parley/test/parleytest"
)

// TestWebSocketTransport runs direct, group and idle over WebSocket
// (-transport ws) with the same exact checks as over TCP.
func TestWebSocketTransport(t *testing.T) {
	cfg := parleytest.Config(t)
	cfg.SendRate = 0
	cfg.WSListen = "auto"
	cfg.MetricsListen = "127.0.0.1:0"
	env := parleytest.Start(t, cfg)
	before := env.Srv.MetricWith("parley_gateway_ws_handshakes_total", "result", "ok")

	rep := runScenario(t, env, Config{Scenario: "direct", Transport: "ws", Rate: 400, Duration: 2 * time.Second, Pairs: 20})
	checkSends(t, rep, 1)
	if rep.Transport != "ws" {
		t.Errorf("report transport %q", rep.Transport)
	}

	rep = runScenario(t, env, Config{Scenario: "group", Transport: "ws", Rate: 200, Duration: 2 * time.Second, Groups: 5, Size: 6})
	checkSends(t, rep, 5)

	rep = runScenario(t, env, Config{Scenario: "idle", Transport: "ws", Conns: 200, Duration: 2 * time.Second,
		PingInterval: 500 * time.Millisecond, MetricsURL: "http://" + env.Srv.MetricsAddr()})
	if ir := rep.Idle; ir == nil || ir.Connected != 200 || ir.Failed != 0 || ir.Dropped != 0 || ir.Pings < 600 || rep.Failed() {
		t.Fatalf("idle report %+v", rep.Idle)
	}
	// Every connection above was a WebSocket: 40 + 30 + 200 upgrades.
	if n := env.Srv.MetricWith("parley_gateway_ws_handshakes_total", "result", "ok") - before; n < 270 {
		t.Errorf("%v WebSocket upgrades", n)
	}
	if err := (&Config{Scenario: "storm", Transport: "ws", Addr: "x", AdminURL: "y"}).Validate(); err == nil {
		t.Errorf("storm over ws accepted")
	}
}
