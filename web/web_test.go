package web

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestHandlerServesThePage checks that every file the page loads is
// served, with the types a browser requires (a module script must be
// JavaScript), and that the page loads nothing from another origin.
func TestHandlerServesThePage(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	for path, typ := range map[string]string{
		"/":                       "text/html",
		"/app.js":                 "text/javascript",
		"/vendor/msgpack.min.js":  "text/javascript",
		"/vendor/msgpack.LICENSE": "",
		"/index.html":             "", // redirected to /
	} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), typ) {
			t.Errorf("%s: %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		if path == "/" {
			page := string(body)
			for _, want := range []string{`src="vendor/msgpack.min.js"`, `type="module" src="app.js"`} {
				if !strings.Contains(page, want) {
					t.Errorf("the page lacks %s", want)
				}
			}
			if strings.Contains(page, "http://") || strings.Contains(page, "https://") || strings.Contains(page, "//cdn") {
				t.Errorf("the page loads something from elsewhere")
			}
		}
	}
}
