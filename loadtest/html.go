package loadtest

import (
	"fmt"
	"html"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
)

// WriteHTML writes the report as one self-contained page (inline CSS and
// SVG, no script, nothing fetched): latency over time (p50 and p99 of
// every metric per interval), throughput over time for the send
// scenarios, the latency distribution (percentile curves), and the
// summary tables.
func (rep *Report) WriteHTML(w io.Writer) error {
	var b strings.Builder
	title := "parley-load " + rep.Scenario
	fmt.Fprintf(&b, `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>%s</title>
<style>
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}
.sub{color:#666;margin-bottom:16px}
table{border-collapse:collapse;margin:4px 0 12px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}
.bad{color:#b00;font-weight:bold}.ok{color:#070;font-weight:bold}
.charts{display:flex;flex-wrap:wrap;gap:16px}
svg{background:#fcfcfc;border:1px solid #e4e4e4}
svg text{font:11px system-ui,sans-serif;fill:#444}
.note{color:#8a5300}
pre{background:#f6f6f6;padding:8px;overflow:auto}
</style></head><body>
`, html.EscapeString(title))
	fmt.Fprintf(&b, "<h1>%s</h1>\n<div class=\"sub\">run %s against %s, %d connections</div>\n",
		html.EscapeString(title), html.EscapeString(rep.RunPrefix), html.EscapeString(rep.Addr), rep.Connections)
	if rep.Failed() {
		b.WriteString("<p class=\"bad\">FAILED: see the summary below.</p>\n")
	} else {
		b.WriteString("<p class=\"ok\">PASSED: nothing lost, duplicated or failed.</p>\n")
	}

	b.WriteString("<h2>Summary</h2>\n")
	rep.htmlSummary(&b)

	names := rep.SeriesNames
	b.WriteString("<h2>Charts</h2>\n<div class=\"charts\">\n")
	// Latency over time.
	var over []chartLine
	for i, name := range names {
		var p50, p99 []xy
		for _, pt := range rep.Timeline {
			l, ok := pt.Latency[name]
			if !ok || l.N == 0 {
				p50, p99 = append(p50, xy{pt.T, math.NaN()}), append(p99, xy{pt.T, math.NaN()})
				continue
			}
			p50, p99 = append(p50, xy{pt.T, l.P50}), append(p99, xy{pt.T, l.P99})
		}
		over = append(over, chartLine{name + " p99", palette[i%len(palette)], "", p99},
			chartLine{name + " p50", palette[i%len(palette)], "5,4", p50})
	}
	b.WriteString(svgChart("Latency over time (p50 dashed, p99 solid)", "seconds since start", "ms (log)", over, false, true))
	// Throughput over time (send scenarios): deliveries, and sends
	// apart (a large group's deliveries are thousands of times its sends).
	if rep.Sent > 0 {
		var sends, conf, deliv []xy
		for _, pt := range rep.Timeline {
			sends, conf, deliv = append(sends, xy{pt.T, pt.Sends}), append(conf, xy{pt.T, pt.Confirmed}), append(deliv, xy{pt.T, pt.Deliveries})
		}
		b.WriteString(svgChart("Deliveries over time", "seconds since start", "deliveries per second",
			[]chartLine{{"deliveries/s", palette[1], "", deliv}}, false, false))
		lines := []chartLine{{"sent/s", palette[0], "", sends}, {"confirmed/s", palette[2], "5,4", conf}}
		if rep.Mixed != nil {
			var reads []xy
			for _, pt := range rep.Timeline {
				reads = append(reads, xy{pt.T, pt.Reads})
			}
			lines = append(lines, chartLine{"read_ok/s", palette[3], "", reads})
		}
		b.WriteString(svgChart("Sends over time", "seconds since start", "per second", lines, false, false))
	}
	// Server memory over time (idle).
	var rss []xy
	for _, pt := range rep.Timeline {
		if pt.ServerRSS > 0 {
			rss = append(rss, xy{pt.T, float64(pt.ServerRSS) / (1 << 20)})
		}
	}
	if len(rss) > 0 {
		b.WriteString(svgChart("Server RSS over time", "seconds since start", "MiB",
			[]chartLine{{"server RSS", palette[3], "", rss}}, false, false))
	}
	// Distribution.
	var dist []chartLine
	for i, name := range names {
		var pts []xy
		for _, c := range rep.Curves[name] {
			pts = append(pts, xy{nines(c.P), c.Ms})
		}
		if len(pts) > 0 {
			dist = append(dist, chartLine{name, palette[i%len(palette)], "", pts})
		}
	}
	b.WriteString(svgChart("Latency distribution (by percentile)", "percentile", "ms (log)", dist, true, true))
	b.WriteString("</div>\n")

	if len(rep.Notes) > 0 {
		b.WriteString("<h2>Notes</h2>\n<ul>\n")
		for _, n := range rep.Notes {
			fmt.Fprintf(&b, "<li class=\"note\">%s</li>\n", html.EscapeString(n))
		}
		b.WriteString("</ul>\n")
	}
	b.WriteString("<h2>Text report</h2>\n<pre>")
	var t strings.Builder
	rep.WriteTable(&t)
	b.WriteString(html.EscapeString(t.String()))
	b.WriteString("</pre>\n</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"}

// htmlSummary writes the key figures, the latency table, CPU and errors.
func (rep *Report) htmlSummary(b *strings.Builder) {
	type kv struct{ k, v string }
	var rows []kv
	add := func(k, format string, a ...any) { rows = append(rows, kv{k, fmt.Sprintf(format, a...)}) }
	switch {
	case rep.Idle != nil:
		ir := rep.Idle
		add("connections", "%d of %d (failed %d, dropped %d)", ir.Connected, ir.Conns, ir.Failed, ir.Dropped)
		add("server RSS per connection", "%.0f bytes (%.2f KiB)", ir.RSSPerConnBytes, ir.RSSPerConnBytes/1024)
		add("server RSS", "%.1f → %.1f → %.1f MiB (before, connected, after the hold; %s)", mib(ir.ServerRSSBefore), mib(ir.ServerRSSConnected), mib(ir.ServerRSSAfter), ir.RSSSource)
		add("tool RSS per connection", "%.0f bytes", ir.ToolRSSPerConnBytes)
		add("hold", "%.1f s, a ping every %g s per connection, %d pongs", ir.HoldS, ir.PingIntervalS, ir.Pings)
	case rep.Storm != nil:
		sr := rep.Storm
		add("devices", "%d, %d conversations, %d messages each", sr.Devices, sr.Conversations, sr.MsgsPerConv)
		add("wall time", "%.0f ms (all reconnected and snapshotted)", sr.WallMs)
		add("finished / failed", "%d / %d", sr.Finished, sr.Failed)
		add("rate-limited (retried)", "%d", sr.RateLimited)
		add("snapshot items / events / item errors / mismatches", "%d / %d / %d / %d", sr.SnapshotItems, sr.SnapshotEvents, sr.SnapshotItemErrors, sr.SnapshotMismatch)
		if sr.ServerCPUUsPerDevice != nil {
			add("server CPU per device", "%.0f µs", *sr.ServerCPUUsPerDevice)
		}
	default:
		add("window", "%.1f s at %.0f sends/s target", rep.DurationS, rep.TargetRate)
		switch rep.Scenario {
		case "group":
			add("groups", "%d × %d members", rep.Groups, rep.GroupSize)
		case "large":
			add("group", "%d members, %d online, %d senders", rep.Members, rep.Online, rep.Senders)
			if mr := rep.Moderation; mr != nil {
				add("moderation", "%s", strings.TrimPrefix(mr.text(), "moderation "))
			}
		case "direct":
			add("pairs", "%d", rep.Pairs)
		case "mixed":
			if mr := rep.Mixed; mr != nil {
				add("users / devices", "%d / %d (%.2f per user, %d users with several)", mr.Users, mr.Devices, mr.DevicesPerUser, mr.MultiDeviceUsers)
				add("conversations", "%d direct (%d per user), %d groups of %d; %.2f per user", mr.Directs, mr.DirectsPerUser, mr.Groups, mr.GroupSize, mr.ConvsPerUser)
				add("message rate per user", "%.3f/s (%d sends to direct conversations, %d to groups)", mr.MsgsPerUserPerS, mr.DirectSends, mr.GroupSends)
				add("pushes to the sender's other devices", "%d of %d owed", mr.SiblingPushed, mr.SiblingOwed)
				add("reads", "p %.2f, %.0f ms later: %d sent, %d read_ok (%.0f/s), %d unsent, %d short, %d read_changed",
					mr.ReadProb, mr.ReadDelayMs, mr.Reads, mr.ReadOK, mr.ReadsPerS, mr.ReadsUnsent, mr.ReadShort, mr.ReadChanged)
			}
		}
		add("sent / confirmed", "%d / %d (%.0f/s confirmed)", rep.Sent, rep.Confirmed, rep.ConfirmedPerS)
		add("delivered / expected", "%d / %d (%.0f deliveries/s)", rep.Delivered, rep.Expected, rep.DeliveriesPerS)
		add("lost / duplicated", "%d / %d", rep.Lost, rep.Duplicated)
		add("acks / hints / kicks / disconnects", "%d / %d / %d / %d", rep.Acks, rep.Hints, rep.Kicks, rep.Disconnects)
	}
	var errs []string
	for _, k := range slices.Sorted(maps.Keys(rep.Errors)) {
		errs = append(errs, fmt.Sprintf("%s=%d", k, rep.Errors[k]))
	}
	if len(errs) == 0 {
		errs = []string{"none"}
	}
	add("errors", "%s", strings.Join(errs, " "))
	b.WriteString("<table>\n")
	for _, r := range rows {
		fmt.Fprintf(b, "<tr><th class=\"l\">%s</th><td class=\"l\">%s</td></tr>\n", html.EscapeString(r.k), html.EscapeString(r.v))
	}
	b.WriteString("</table>\n")

	b.WriteString("<table>\n<tr><th class=\"l\">latency ms</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th><th>max</th><th>mean</th><th>count</th></tr>\n")
	for _, name := range rep.SeriesNames {
		s := rep.Latency[name]
		fmt.Fprintf(b, "<tr><td class=\"l\">%s</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%d</td></tr>\n",
			html.EscapeString(name), s.P50, s.P90, s.P99, s.P999, s.Max, s.Mean, s.Count)
	}
	b.WriteString("</table>\n")

	if len(rep.CPU) > 0 {
		b.WriteString("<table>\n<tr><th class=\"l\">CPU</th><th>cores</th><th>seconds</th><th>µs/send</th><th>µs/delivery</th></tr>\n")
		f := func(p *float64) string {
			if p == nil {
				return "-"
			}
			return strconv.FormatFloat(*p, 'f', 2, 64)
		}
		for _, c := range rep.CPU {
			fmt.Fprintf(b, "<tr><td class=\"l\">%s</td><td>%.2f</td><td>%.2f</td><td>%s</td><td>%s</td></tr>\n",
				html.EscapeString(c.Name), c.Cores, c.CPUSeconds, f(c.UsPerSend), f(c.UsPerDeliv))
		}
		b.WriteString("</table>\n")
	}
}

// xy is one chart point; a NaN y breaks the line.
type xy struct{ x, y float64 }

type chartLine struct {
	name  string
	color string
	dash  string
	pts   []xy
}

// nines maps a percentile to the distribution chart's x: log10 of
// 1/(1 − p/100), so 0 → 0, 90 → 1, 99 → 2, 99.9 → 3 (100 is drawn one
// step past the last finite point).
func nines(p float64) float64 {
	if p >= 100 {
		return math.Inf(1)
	}
	return -math.Log10(1 - p/100)
}

// svgChart draws lines in a 560×320 SVG: a linear x axis (or, with
// percentileX, the nines scale) and a linear or log y axis.
func svgChart(title, xLabel, yLabel string, lines []chartLine, percentileX, logY bool) string {
	const W, H = 560, 340
	const left, right, top, bottom = 64, 16, 28, 84
	pw, ph := float64(W-left-right), float64(H-top-bottom)
	// Ranges.
	xmin, xmax := math.Inf(1), math.Inf(-1)
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, l := range lines {
		for _, p := range l.pts {
			if !math.IsInf(p.x, 0) {
				xmin, xmax = math.Min(xmin, p.x), math.Max(xmax, p.x)
			}
			if math.IsNaN(p.y) || (logY && p.y <= 0) {
				continue
			}
			ymin, ymax = math.Min(ymin, p.y), math.Max(ymax, p.y)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`, W, H, W, H, html.EscapeString(title))
	fmt.Fprintf(&b, `<text x="%d" y="18" style="font-size:13px;font-weight:600;fill:#222">%s</text>`, left, html.EscapeString(title))
	if math.IsInf(xmin, 0) || math.IsInf(ymin, 0) {
		fmt.Fprintf(&b, `<text x="%d" y="%d">no data</text></svg>`+"\n", W/2-20, H/2)
		return b.String()
	}
	if percentileX {
		xmin, xmax = 0, math.Max(math.Ceil(xmax+0.5), 2)
	} else {
		xmin = math.Min(xmin, 0)
		if xmax <= xmin {
			xmax = xmin + 1
		}
	}
	var yticks []float64
	if logY {
		lo, hi := math.Floor(math.Log10(ymin)), math.Ceil(math.Log10(ymax))
		if hi <= lo {
			hi = lo + 1
		}
		ymin, ymax = math.Pow(10, lo), math.Pow(10, hi)
		for e := lo; e <= hi; e++ {
			yticks = append(yticks, math.Pow(10, e))
		}
	} else {
		ymin = 0
		step := niceStep(ymax / 5)
		ymax = math.Max(step, math.Ceil(ymax/step)*step)
		for v := 0.0; v <= ymax+step/2; v += step {
			yticks = append(yticks, v)
		}
	}
	X := func(x float64) float64 {
		if math.IsInf(x, 1) {
			x = xmax
		}
		return float64(left) + (x-xmin)/(xmax-xmin)*pw
	}
	Y := func(y float64) float64 {
		if logY {
			return float64(top) + ph - (math.Log10(y)-math.Log10(ymin))/(math.Log10(ymax)-math.Log10(ymin))*ph
		}
		return float64(top) + ph - (y-ymin)/(ymax-ymin)*ph
	}
	// Grid and axes.
	for _, v := range yticks {
		y := Y(v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e6e6e6"/>`, left, y, W-right, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`, left-4, y+4, fmtTick(v))
	}
	if percentileX {
		for e := 0.0; e <= xmax; e++ {
			x := X(e)
			label := nineLabel(int(e))
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e6e6e6"/>`, x, top, x, H-bottom)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x, H-bottom+14, label)
		}
	} else {
		step := niceStep((xmax - xmin) / 8)
		for v := math.Ceil(xmin/step) * step; v <= xmax+step/1e6; v += step {
			x := X(v)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#f0f0f0"/>`, x, top, x, H-bottom)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x, H-bottom+14, fmtTick(v))
		}
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`, left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.0f" y="%d" text-anchor="middle">%s</text>`, float64(left)+pw/2, H-bottom+30, html.EscapeString(xLabel))
	fmt.Fprintf(&b, `<text transform="translate(14 %.0f) rotate(-90)" text-anchor="middle">%s</text>`, float64(top)+ph/2, html.EscapeString(yLabel))
	// Lines.
	for _, l := range lines {
		var path strings.Builder
		pen := false
		n := 0
		for _, p := range l.pts {
			if math.IsNaN(p.y) || (logY && p.y <= 0) {
				pen = false
				continue
			}
			y := math.Max(p.y, ymin)
			cmd := "L"
			if !pen {
				cmd = "M"
			}
			fmt.Fprintf(&path, "%s%.1f %.1f ", cmd, X(p.x), Y(y))
			pen = true
			n++
		}
		if n == 0 {
			continue
		}
		dash := ""
		if l.dash != "" {
			dash = ` stroke-dasharray="` + l.dash + `"`
		}
		fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="%s" stroke-width="1.6"%s/>`, strings.TrimSpace(path.String()), l.color, dash)
		if n == 1 { // a single point: show it
			p := l.pts[0]
			for _, q := range l.pts {
				if !math.IsNaN(q.y) {
					p = q
					break
				}
			}
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>`, X(p.x), Y(math.Max(p.y, ymin)), l.color)
		}
	}
	// Legend, below the x label, wrapping.
	lx, ly := float64(left), H-30
	for _, l := range lines {
		wdt := 30 + 6.5*float64(len(l.name))
		if lx+wdt > W-right && lx > float64(left) {
			lx, ly = float64(left), ly+18
		}
		dash := ""
		if l.dash != "" {
			dash = ` stroke-dasharray="` + l.dash + `"`
		}
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%d" x2="%.0f" y2="%d" stroke="%s" stroke-width="2"%s/>`, lx, ly-4, lx+18, ly-4, l.color, dash)
		fmt.Fprintf(&b, `<text x="%.0f" y="%d">%s</text>`, lx+22, ly, html.EscapeString(l.name))
		lx += wdt
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// nineLabel names the percentile with k nines: 0, 90, 99, 99.9, 99.99, …
func nineLabel(k int) string {
	switch k {
	case 0:
		return "0"
	case 1:
		return "90"
	case 2:
		return "99"
	}
	return "99." + strings.Repeat("9", k-2)
}

// niceStep rounds a raw axis step up to 1, 2 or 5 × 10^k.
func niceStep(raw float64) float64 {
	if raw <= 0 || math.IsNaN(raw) || math.IsInf(raw, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

func fmtTick(v float64) string {
	v = math.Round(v*1e6) / 1e6
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case math.Abs(v) >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}
