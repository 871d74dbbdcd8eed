// Package web is Parley's browser demo: one static page (index.html and
// the app.js module, with @msgpack/msgpack vendored under vendor/) that
// logs in over the gateway's WebSocket listener with a device id and
// token, lists the conversations, shows pushes live and sends. Handler
// serves it; cmd/parley-web runs it (`make web`). Nothing is fetched from
// elsewhere at run time.
package web

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed index.html app.js vendor
var files embed.FS

// Handler serves the demo's files.
func Handler() http.Handler {
	sub, _ := fs.Sub(files, ".")
	return http.FileServerFS(sub)
}
