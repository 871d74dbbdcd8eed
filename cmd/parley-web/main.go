// Command parley-web serves Parley's browser demo (package web) over HTTP.
// Open it, give the gateway's WebSocket URL (ws_listen), a device id and
// its token, and log in:
//
//	parley-web -listen 127.0.0.1:8080
//	open 'http://127.0.0.1:8080/?ws=ws://127.0.0.1:7071/v1/ws&device=ana-phone'
package main

import (
	"flag"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/parley-im/parley/web"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "HTTP `address` to serve the demo on")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	log.Info("serving the browser demo", "url", "http://"+*listen+"/")
	srv := &http.Server{Addr: *listen, Handler: web.Handler(), ReadHeaderTimeout: 10 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		log.Error("parley-web", "err", err)
		os.Exit(1)
	}
}
