package capacity

import (
	"encoding/xml"
	"fmt"
	"math"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// Markdown renders the report as a markdown document: what ran, the goals,
// every figure grouped by phase, the invariant violations, the leader's CPU
// profile and a link to the SVG chart (capacity-<preset>.svg).
func (r *Report) Markdown() string {
	var b strings.Builder

	fmt.Fprintf(&b, "# Capacity benchmark (preset %s)\n\n", renderInline(r.Preset))

	if r.Started.IsZero() {
		b.WriteString("Run date unknown.")
	} else {
		fmt.Fprintf(&b, "Run %s.", r.Started.UTC().Format("2006-01-02 15:04:05 MST"))
	}
	if strings.TrimSpace(r.Command) != "" {
		b.WriteString(" Rerun with:\n\n")
		fence := renderFence(r.Command)
		fmt.Fprintf(&b, "%ssh\n%s\n%s\n\n", fence, strings.TrimRight(r.Command, "\n"), fence)
	} else {
		b.WriteString("\n\n")
	}

	fmt.Fprintf(&b, "**Machine:** %s\n\n", renderMachine(r.Machine))

	fmt.Fprintf(&b, "**Real:** %s\n\n", renderList(r.Real))
	fmt.Fprintf(&b, "**Simulated:** %s\n\n", renderList(r.Simulated))

	// Goals.
	b.WriteString("## Goals\n\n")
	if len(r.Goals) == 0 {
		b.WriteString("No goals recorded.\n\n")
	} else {
		b.WriteString("| Goal | Target | Measured | Met |\n")
		b.WriteString("|---|---|---|:---:|\n")
		for _, g := range r.Goals {
			met := "✗"
			if g.Met {
				met = "✓"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n",
				renderCell(g.Name), renderCell(g.Target), renderCell(g.Measured), met)
		}
		b.WriteString("\n")
	}

	// Figures.
	b.WriteString("## Figures\n\n")
	b.WriteString("| Phase | Figure | Value |\n")
	b.WriteString("|---|---|---:|\n")
	for _, grp := range r.renderFigures() {
		for i, row := range grp.rows {
			phase := ""
			if i == 0 {
				phase = "**" + renderCell(grp.phase) + "**"
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", phase, renderCell(row[0]), renderCell(row[1]))
		}
	}
	b.WriteString("\n")

	// Violations.
	b.WriteString("## Invariant violations\n\n")
	if len(r.Violations) == 0 {
		b.WriteString("none\n\n")
	} else {
		for _, v := range r.Violations {
			fmt.Fprintf(&b, "- %s\n", renderInline(v))
		}
		b.WriteString("\n")
	}

	// Profile.
	if r.ProfileTop != "" {
		b.WriteString("## Leader CPU profile (top)\n\n")
		fence := renderFence(r.ProfileTop)
		fmt.Fprintf(&b, "%stext\n%s\n%s\n\n", fence, strings.TrimRight(r.ProfileTop, "\n"), fence)
	}

	fmt.Fprintf(&b, "![events/s and p99 append latency over time](capacity-%s.svg)\n", url.PathEscape(r.Preset))
	return b.String()
}

// renderGroup is one phase of the figures table: rows of (figure, value).
type renderGroup struct {
	phase string
	rows  [][2]string
}

func (r *Report) renderFigures() []renderGroup {
	win := func(phase string, w Window) renderGroup {
		return renderGroup{phase, [][2]string{
			{"duration", renderSeconds(w.Seconds)},
			{"events appended", renderThousands(int64(w.Events))},
			{"events/s", renderRate(w.EventsPerSec)},
			{"append calls", renderThousands(int64(w.Appends))},
			{"append calls/s", renderRate(w.AppendsPerSec)},
			{"append latency p50", renderMs(w.P50Ms)},
			{"append latency p99", renderMs(w.P99Ms)},
			{"append latency p99.9", renderMs(w.P999Ms)},
			{"append errors", renderThousands(int64(w.Errors))},
		}}
	}
	serverRSS := make([]string, 0, len(r.ServerRSSBytes))
	for _, v := range r.ServerRSSBytes {
		serverRSS = append(serverRSS, renderBytes(float64(v)))
	}
	serverRSSText := "—"
	if len(serverRSS) > 0 {
		serverRSSText = strings.Join(serverRSS, ", ")
	}

	return []renderGroup{
		{"Start-up", [][2]string{
			{"nodes ready", renderSeconds(r.NodesReadySeconds)},
			{"submit all tasks", renderSeconds(r.SubmitSeconds)},
			{"all tasks running", renderSeconds(r.AllRunningSeconds)},
			{"placements/s", renderRate(r.PlacementsPerSec)},
		}},
		win("Steady state", r.Steady),
		win("Overall", r.Overall),
		{"Raft apply batches (leader, steady)", [][2]string{
			{"apply entries", renderThousands(int64(r.ApplyEntries))},
			{"apply commands", renderThousands(int64(r.ApplyCommands))},
			{"commands per entry", renderFloat(r.CommandsPerEntry, 2)},
			{"commands per entry histogram", renderHistogram(r.CommandsPerEntryHis)},
		}},
		{"Resources", [][2]string{
			{"leader CPU (steady avg)", renderCores(r.LeaderCPUCores)},
			{"leader RSS (peak)", renderBytes(float64(r.LeaderRSSBytes))},
			{"server RSS (peak, per server)", serverRSSText},
			{"server CPU (all servers, steady avg)", renderCores(r.ServerCPUCores)},
			{"node processes", renderThousands(int64(r.NodeProcesses))},
			{"nodes per process", renderThousands(int64(r.NodesPerProcess))},
			{"node process RSS (median peak)", renderBytes(float64(r.NodeProcessRSSBytes))},
			{"bytes per task actor", renderBytes(r.BytesPerTaskActor)},
			{"node CPU (all node processes, steady avg)", renderCores(r.NodeCPUCores)},
		}},
		{"Fault 1: node kill", [][2]string{
			{"killed nodes", renderThousands(int64(r.KilledNodes))},
			{"tasks they held", renderThousands(int64(r.KilledTasks))},
			{"detect time (kill → last declared down)", renderSeconds(r.DetectSeconds)},
			{"detected by", renderCounts(r.DetectedBy)},
			{"recovered tasks", renderThousands(int64(r.RecoveredTasks))},
			{"recovery p50", renderSeconds(r.RecoveryP50)},
			{"recovery p99", renderSeconds(r.RecoveryP99)},
			{"recovery max", renderSeconds(r.RecoveryMax)},
			{"healthy nodes declared down meanwhile", renderThousands(int64(r.Fault1FalseDowns))},
		}},
		{"Fault 2: leader kill", [][2]string{
			{"failover (kill → first append on new leader)", renderSeconds(r.FailoverSeconds)},
			{"healthy nodes falsely declared down", renderThousands(int64(r.FalseDownNodes))},
			{"old leader", renderOr(r.OldLeader, "—")},
			{"new leader", renderOr(r.NewLeader, "—")},
		}},
		{"End", [][2]string{
			{"total run time", renderSeconds(r.TotalSeconds)},
			{"tasks succeeded", renderThousands(int64(r.Succeeded))},
			{"tasks cancelled at the end", renderThousands(int64(r.Cancelled))},
			{"logs checked", renderThousands(int64(r.CheckedLogs))},
			{"events checked", renderThousands(int64(r.CheckedEvents))},
			{"invariant violations", renderThousands(int64(len(r.Violations)))},
		}},
	}
}

// SVG renders r.Timeline as a self-contained SVG line chart: events/s on
// the left axis (blue), p99 append latency in ms on the right axis (red),
// seconds on the x axis, and every mark as a dashed vertical line.
func (r *Report) SVG() string {
	const (
		width   = 900.0
		height  = 420.0
		left    = 80.0
		right   = 80.0
		top     = 62.0
		bottom  = 56.0
		plotW   = width - left - right
		plotH   = height - top - bottom
		plotX0  = left
		plotX1  = width - right
		plotY0  = top
		plotY1  = height - bottom
		blue    = "#1f77b4"
		red     = "#d62728"
		grey    = "#888888"
		gridCol = "#e5e5e5"
	)

	// Data ranges, ignoring non-finite values.
	xMin, xMax := math.Inf(1), math.Inf(-1)
	aMax, pMax := 0.0, 0.0
	see := func(t float64) {
		if renderFinite(t) {
			xMin = math.Min(xMin, t)
			xMax = math.Max(xMax, t)
		}
	}
	for _, s := range r.Timeline {
		see(s.T)
		if renderFinite(s.EventsPerSec) {
			aMax = math.Max(aMax, s.EventsPerSec)
		}
		if renderFinite(s.P99Ms) {
			pMax = math.Max(pMax, s.P99Ms)
		}
	}
	for _, m := range r.Marks {
		see(m.T)
	}
	if math.IsInf(xMin, 1) {
		xMin, xMax = 0, 1
	}
	if xMin > 0 {
		xMin = 0
	}

	xTicks := renderNiceTicks(xMin, xMax, 10)
	aTicks := renderNiceTicks(0, aMax, 6)
	pTicks := renderNiceTicks(0, pMax, 6)
	xLo, xHi := xTicks[0], xTicks[len(xTicks)-1]
	aHi := aTicks[len(aTicks)-1]
	pHi := pTicks[len(pTicks)-1]

	sx := func(t float64) float64 { return plotX0 + (t-xLo)/(xHi-xLo)*plotW }
	sa := func(v float64) float64 { return plotY1 - v/aHi*plotH }
	sp := func(v float64) float64 { return plotY1 - v/pHi*plotH }

	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n",
		int(width), int(height), int(width), int(height))
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>`+"\n", int(width), int(height))

	// Title.
	fmt.Fprintf(&b, `<text x="%s" y="22" text-anchor="middle" font-size="15" font-weight="bold">%s</text>`+"\n",
		renderCoord(width/2), renderXML(fmt.Sprintf("warren capacity (preset %s): events/s and p99 append latency", r.Preset)))

	// Legend, under the title.
	legendY := 42.0
	lx := width/2 - 170
	fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"/>`+"\n",
		renderCoord(lx), renderCoord(legendY), renderCoord(lx+24), renderCoord(legendY), blue)
	fmt.Fprintf(&b, `<text x="%s" y="%s">events/s (left axis)</text>`+"\n", renderCoord(lx+30), renderCoord(legendY+4))
	lx += 175
	fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"/>`+"\n",
		renderCoord(lx), renderCoord(legendY), renderCoord(lx+24), renderCoord(legendY), red)
	fmt.Fprintf(&b, `<text x="%s" y="%s">p99 append latency, ms (right axis)</text>`+"\n", renderCoord(lx+30), renderCoord(legendY+4))

	// Grid and left axis ticks.
	for _, v := range aTicks {
		y := sa(v)
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>`+"\n",
			renderCoord(plotX0), renderCoord(y), renderCoord(plotX1), renderCoord(y), gridCol)
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>`+"\n",
			renderCoord(plotX0-5), renderCoord(y), renderCoord(plotX0), renderCoord(y), blue)
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="end" fill="%s">%s</text>`+"\n",
			renderCoord(plotX0-8), renderCoord(y+4), blue, renderXML(renderTick(v, aTicks)))
	}
	// Right axis ticks.
	for _, v := range pTicks {
		y := sp(v)
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>`+"\n",
			renderCoord(plotX1), renderCoord(y), renderCoord(plotX1+5), renderCoord(y), red)
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="start" fill="%s">%s</text>`+"\n",
			renderCoord(plotX1+8), renderCoord(y+4), red, renderXML(renderTick(v, pTicks)))
	}
	// X axis ticks.
	for _, v := range xTicks {
		x := sx(v)
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#333333"/>`+"\n",
			renderCoord(x), renderCoord(plotY1), renderCoord(x), renderCoord(plotY1+5))
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n",
			renderCoord(x), renderCoord(plotY1+18), renderXML(renderTick(v, xTicks)))
	}

	// Axes.
	fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#333333"/>`+"\n",
		renderCoord(plotX0), renderCoord(plotY1), renderCoord(plotX1), renderCoord(plotY1))
	fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>`+"\n",
		renderCoord(plotX0), renderCoord(plotY0), renderCoord(plotX0), renderCoord(plotY1), blue)
	fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>`+"\n",
		renderCoord(plotX1), renderCoord(plotY0), renderCoord(plotX1), renderCoord(plotY1), red)

	// Axis titles.
	fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle" font-size="12">seconds since first task submitted</text>`+"\n",
		renderCoord(plotX0+plotW/2), renderCoord(height-12))
	ly := plotY0 + plotH/2
	fmt.Fprintf(&b, `<text x="18" y="%s" text-anchor="middle" font-size="12" fill="%s" transform="rotate(-90 18 %s)">events/s</text>`+"\n",
		renderCoord(ly), blue, renderCoord(ly))
	rx := width - 18
	fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle" font-size="12" fill="%s" transform="rotate(90 %s %s)">p99 append latency (ms)</text>`+"\n",
		renderCoord(rx), renderCoord(ly), red, renderCoord(rx), renderCoord(ly))

	// Marks.
	var markLabels []string
	for _, m := range r.Marks {
		if !renderFinite(m.T) {
			continue
		}
		x := sx(m.T)
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="1" stroke-dasharray="5,4"/>`+"\n",
			renderCoord(x), renderCoord(plotY0), renderCoord(x), renderCoord(plotY1), grey)
		// The label is drawn after the series so that lines do not hide it.
		tx, ty := x+4, plotY0+4
		markLabels = append(markLabels, fmt.Sprintf(
			`<text x="%s" y="%s" fill="#444444" font-size="10" stroke="#ffffff" stroke-width="3" paint-order="stroke" transform="rotate(90 %s %s)">%s</text>`+"\n",
			renderCoord(tx), renderCoord(ty), renderCoord(tx), renderCoord(ty), renderXML(m.Label)))
	}

	// Series.
	if len(r.Timeline) == 0 {
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle" fill="%s" font-size="14">no samples</text>`+"\n",
			renderCoord(plotX0+plotW/2), renderCoord(plotY0+plotH/2), grey)
	} else {
		series := func(val func(Sample) float64, scale func(float64) float64, colour string) {
			var pts []string
			for _, s := range r.Timeline {
				v := val(s)
				if !renderFinite(s.T) || !renderFinite(v) {
					continue
				}
				pts = append(pts, renderCoord(sx(s.T))+","+renderCoord(scale(v)))
			}
			if len(pts) == 0 {
				return
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" stroke-linejoin="round" points="%s"/>`+"\n",
				colour, strings.Join(pts, " "))
			if len(pts) == 1 {
				xy := strings.SplitN(pts[0], ",", 2)
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="2.5" fill="%s"/>`+"\n", xy[0], xy[1], colour)
			}
		}
		series(func(s Sample) float64 { return s.EventsPerSec }, sa, blue)
		series(func(s Sample) float64 { return s.P99Ms }, sp, red)
	}

	for _, l := range markLabels {
		b.WriteString(l)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// renderNiceTicks returns evenly spaced, rounded tick values (steps of 1, 2
// or 5 times a power of ten) covering [lo, hi] with about n intervals. The
// first tick is <= lo and the last >= hi; there are always at least two
// distinct ticks, so the span is never zero.
func renderNiceTicks(lo, hi float64, n int) []float64 {
	if !renderFinite(lo) {
		lo = 0
	}
	if !renderFinite(hi) {
		hi = lo + 1
	}
	if hi < lo {
		lo, hi = hi, lo
	}
	if hi-lo <= 0 {
		hi = lo + 1
	}
	if n < 1 {
		n = 1
	}
	step := renderNiceNum((hi-lo)/float64(n), true)
	if !renderFinite(step) || step <= 0 {
		return []float64{lo, hi}
	}
	start := math.Floor(lo/step) * step
	end := math.Ceil(hi/step) * step
	if end <= start {
		end = start + step
	}
	var ticks []float64
	for i := 0; ; i++ {
		v := start + float64(i)*step
		// Snap tiny floating errors (0.30000000000000004) to the grid.
		v = math.Round(v/step) * step
		ticks = append(ticks, v)
		if v >= end-step/2 || i > 1000 {
			break
		}
	}
	if len(ticks) < 2 {
		ticks = append(ticks, ticks[0]+step)
	}
	return ticks
}

// renderNiceNum rounds x to 1, 2, 5 or 10 times a power of ten.
func renderNiceNum(x float64, round bool) float64 {
	if x <= 0 || !renderFinite(x) {
		return 1
	}
	exp := math.Floor(math.Log10(x))
	f := x / math.Pow(10, exp)
	var nf float64
	if round {
		switch {
		case f < 1.5:
			nf = 1
		case f < 3:
			nf = 2
		case f < 7:
			nf = 5
		default:
			nf = 10
		}
	} else {
		switch {
		case f <= 1:
			nf = 1
		case f <= 2:
			nf = 2
		case f <= 5:
			nf = 5
		default:
			nf = 10
		}
	}
	return nf * math.Pow(10, exp)
}

// renderTick formats one tick value with as many decimals as the tick step
// needs, and thousands separators for whole numbers.
func renderTick(v float64, ticks []float64) string {
	step := 1.0
	if len(ticks) >= 2 {
		step = ticks[1] - ticks[0]
	}
	if step >= 1 || step <= 0 {
		return renderThousands(int64(math.Round(v)))
	}
	dec := int(math.Ceil(-math.Log10(step) - 1e-9))
	if dec < 0 {
		dec = 0
	}
	if dec > 6 {
		dec = 6
	}
	return strconv.FormatFloat(v, 'f', dec, 64)
}

// renderCoord formats an SVG coordinate; non-finite values become 0 so the
// output never holds NaN or Inf.
func renderCoord(v float64) string {
	if !renderFinite(v) {
		v = 0
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

func renderFinite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// renderXML escapes s for XML character data and attribute values.
func renderXML(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// renderBytes formats a byte count with binary units: 512 B, 1.5 KiB, 3.2 MiB, 1.07 GiB.
func renderBytes(v float64) string {
	if !renderFinite(v) {
		return "—"
	}
	neg := v < 0
	if neg {
		v = -v
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	var s string
	switch {
	case i == 0:
		s = fmt.Sprintf("%.0f %s", v, units[i])
	case v < 10:
		s = fmt.Sprintf("%.2f %s", v, units[i])
	default:
		s = fmt.Sprintf("%.1f %s", v, units[i])
	}
	if neg {
		s = "-" + s
	}
	return s
}

// renderThousands formats n with comma thousands separators: 1234567 -> 1,234,567.
func renderThousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	var b strings.Builder
	b.WriteString(sign)
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// renderRate formats a per-second rate: whole numbers with thousands
// separators from 100 up, one decimal below.
func renderRate(v float64) string {
	if !renderFinite(v) {
		return "—"
	}
	if math.Abs(v) >= 100 || v == 0 {
		return renderThousands(int64(math.Round(v))) + " /s"
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " /s"
}

func renderSeconds(v float64) string {
	if !renderFinite(v) {
		return "—"
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + " s"
}

func renderMs(v float64) string {
	if !renderFinite(v) {
		return "—"
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + " ms"
}

func renderCores(v float64) string {
	if !renderFinite(v) {
		return "—"
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + " cores"
}

func renderFloat(v float64, dec int) string {
	if !renderFinite(v) {
		return "—"
	}
	return strconv.FormatFloat(v, 'f', dec, 64)
}

// renderHistogram formats power-of-two buckets as "≤1: n, ≤2: n, ≤4: n",
// skipping empty buckets.
func renderHistogram(h []uint64) string {
	var parts []string
	for i, n := range h {
		if n == 0 {
			continue
		}
		var bound string
		if i < 63 {
			bound = renderThousands(int64(1) << uint(i))
		} else {
			bound = fmt.Sprintf("2^%d", i)
		}
		parts = append(parts, fmt.Sprintf("≤%s: %s", bound, renderThousands(int64(n))))
	}
	if len(parts) == 0 {
		return "—"
	}
	return strings.Join(parts, ", ")
}

// renderCounts formats a map as "a: 1, b: 2" in key order.
func renderCounts(m map[string]int) string {
	if len(m) == 0 {
		return "—"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s: %s", k, renderThousands(int64(m[k]))))
	}
	return strings.Join(parts, ", ")
}

func renderMachine(m Machine) string {
	var parts []string
	if m.CPUs > 0 {
		parts = append(parts, fmt.Sprintf("%d CPUs", m.CPUs))
	}
	if m.MemBytes > 0 {
		parts = append(parts, renderBytes(float64(m.MemBytes))+" memory")
	}
	if m.OS != "" {
		parts = append(parts, m.OS)
	}
	if m.Kernel != "" {
		parts = append(parts, "kernel "+m.Kernel)
	}
	if len(parts) == 0 {
		return "unknown"
	}
	return renderInline(strings.Join(parts, ", "))
}

// renderList joins items with "; " for a one-line paragraph.
func renderList(items []string) string {
	var parts []string
	for _, it := range items {
		if it = strings.TrimSpace(it); it != "" {
			parts = append(parts, renderInline(it))
		}
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, "; ") + "."
}

func renderOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// renderInline flattens s to one line and escapes "<" where markdown would
// take it for the start of an HTML tag.
func renderInline(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '<' && i+1 < len(s) {
			n := s[i+1]
			if n == '/' || n == '!' || n == '?' || (n|0x20) >= 'a' && (n|0x20) <= 'z' {
				b.WriteString("&lt;")
				continue
			}
		}
		b.WriteByte(c)
	}
	return b.String()
}

// renderCell makes s safe inside a markdown table cell.
func renderCell(s string) string {
	return strings.ReplaceAll(renderInline(s), "|", `\|`)
}

// renderFence returns a code fence longer than any backtick run in s.
func renderFence(s string) string {
	longest, run := 0, 0
	for _, c := range s {
		if c == '`' {
			run++
			if run > longest {
				longest = run
			}
		} else {
			run = 0
		}
	}
	n := 3
	if longest >= n {
		n = longest + 1
	}
	return strings.Repeat("`", n)
}
