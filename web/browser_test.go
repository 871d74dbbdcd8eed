//go:build browser

package web_test

// `make test-browser`: the demo page in headless Chromium (Debian package
// chromium, installed on demand), against a real server. Two tabs log in
// as two users of one group and exchange a message each way through the
// page's own form, over WebSocket with the Origin check on.

import (
	"context"
	"net/http/httptest"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/test/testenv"
	"github.com/parley-im/parley/web"
)

func TestBrowserTwoPagesExchangeMessages(t *testing.T) {
	chromium := testenv.Command(t, "chromium", "chromium")
	page := httptest.NewServer(web.Handler())
	defer page.Close()

	cfg := parleytest.Config(t)
	cfg.WSListen = "auto"
	cfg.WSOrigins = page.URL // the page's origin, and only it
	env := parleytest.Start(t, cfg)
	ana, bo := env.User(t, "ana", 1)[0], env.User(t, "bo", 1)[0]
	env.Group(t, "g.browser", ana.User, bo.User)

	// Chromium's profile; removed once the browser is gone (a t.TempDir
	// could be removed while it still writes there).
	profile, err := os.MkdirTemp("", "parley-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(profile)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		append(chromedp.DefaultExecAllocatorOptions[:],
			chromedp.ExecPath(chromium),
			chromedp.NoSandbox,
			chromedp.DisableGPU,
			chromedp.UserDataDir(profile),
		)...)
	defer cancelAlloc()
	tabA, cancelA := chromedp.NewContext(alloc)
	defer cancelA()
	deadline, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go func() { <-deadline.Done(); cancelA() }()

	login := func(tab context.Context, dev parleytest.Device) {
		t.Helper()
		u := page.URL + "/?" + url.Values{"ws": {"ws://" + env.WSAddr + "/v1/ws"}, "device": {dev.ID}}.Encode()
		err := chromedp.Run(tab,
			chromedp.Navigate(u),
			chromedp.WaitVisible("#connect", chromedp.ByQuery),
			chromedp.SetValue("#token", dev.Token, chromedp.ByQuery),
			chromedp.Click("#connect", chromedp.ByQuery),
			// Logged in: the conversation list shows the group, selected.
			chromedp.WaitVisible(`#convs li.selected[data-conv="g.browser"]`, chromedp.ByQuery),
			// Its join event is on screen: the sync ran.
			chromedp.WaitVisible(`#events .event.system`, chromedp.ByQuery),
		)
		if err != nil {
			t.Fatalf("%s logging in: %v", dev.ID, err)
		}
	}
	send := func(tab context.Context, text string) {
		t.Helper()
		err := chromedp.Run(tab,
			chromedp.WaitEnabled("#text", chromedp.ByQuery),
			chromedp.SendKeys("#text", text, chromedp.ByQuery),
			chromedp.Click("#send", chromedp.ByQuery),
		)
		if err != nil {
			t.Fatalf("sending %q: %v", text, err)
		}
	}
	see := func(tab context.Context, who, text string) {
		t.Helper()
		var got string
		sel := `//main[@id="events"]//div[contains(@class,"event")][span[@class="who"]="` + who + `: "]/span[@class="body"][text()="` + text + `"]`
		if err := chromedp.Run(tab, chromedp.WaitVisible(sel, chromedp.BySearch), chromedp.Text(sel, &got, chromedp.BySearch)); err != nil || got != text {
			t.Fatalf("waiting for %q from %s: %q, %v", text, who, got, err)
		}
	}

	login(tabA, ana)
	tabB, cancelB := chromedp.NewContext(tabA) // a second tab of the same browser
	defer cancelB()
	login(tabB, bo)
	send(tabA, "hello from ana's browser")
	see(tabA, "ana", "hello from ana's browser")
	see(tabB, "ana", "hello from ana's browser") // a push, live
	send(tabB, "and back from bo")
	see(tabA, "bo", "and back from bo")

	// The server holds both messages.
	var status string
	if err := chromedp.Run(tabA, chromedp.Text("#status", &status, chromedp.ByQuery)); err != nil || status != "ana / "+ana.ID {
		t.Fatalf("status %q, %v", status, err)
	}
	var conv struct{ Head int64 }
	if st := env.Admin(t, "GET", "/v1/conversations/g.browser", nil, &conv); st != 200 || conv.Head != 3 {
		t.Fatalf("conversation: %d, head %d (want 3: the join and two messages)", st, conv.Head)
	}
}
