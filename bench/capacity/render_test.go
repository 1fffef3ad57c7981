package capacity

import (
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"
)

func renderTestReport() *Report {
	r := &Report{
		Preset:    "small",
		Started:   time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC),
		Command:   "go run ./bench/capacity -preset small",
		Machine:   Machine{CPUs: 8, MemBytes: 32 << 30, OS: "linux", Kernel: "6.1.0"},
		Real:      []string{"3 raft servers", "node daemons over TCP"},
		Simulated: []string{"task work (sleeps)", "disks | pipes & <tags>"},

		NodesReadySeconds: 1.234,
		PlacementsPerSec:  4321.5,
		Steady: Window{Seconds: 60, Events: 1234567, EventsPerSec: 20576.1, Appends: 987654, AppendsPerSec: 16460.9,
			P50Ms: 1.5, P99Ms: 12.25, P999Ms: 40},
		CommandsPerEntryHis: []uint64{5, 0, 7, 1},
		LeaderRSSBytes:      300 << 20,
		ServerRSSBytes:      []int64{300 << 20, 200 << 20},
		DetectedBy:          map[string]int{"session": 3, "heartbeat": 1},
		Violations:          []string{"task 7 ran twice", "event 9 lost"},
		Goals: []Goal{
			{Name: "appends/s", Target: "≥ 10,000", Measured: "20,576", Met: true},
			{Name: "failover", Target: "< 5 s", Measured: "7.1 s | slow", Met: false},
		},
		ProfileTop: "flat  flat%\n10ms 50% runtime.foo\n",
		Marks: []Mark{
			{T: 3, Label: "kill 2 nodes"},
			{T: 6, Label: "kill leader <n1> & co"},
		},
	}
	for i := 0; i < 10; i++ {
		r.Timeline = append(r.Timeline, Sample{
			T:            float64(i),
			EventsPerSec: float64(1000 * (i + 1)),
			P99Ms:        float64(i%4) * 3.3,
		})
	}
	return r
}

func renderParseXML(t *testing.T, s string) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(s))
	for {
		_, err := d.Token()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("SVG does not parse as XML: %v\n%s", err, s)
		}
	}
}

func TestReportMarkdown(t *testing.T) {
	md := renderTestReport().Markdown()
	for _, want := range []string{
		"# Capacity benchmark (preset small)",
		"| Goal | Target | Measured | Met |",
		"| appends/s | ≥ 10,000 | 20,576 | ✓ |",
		`| failover | < 5 s | 7.1 s \| slow | ✗ |`,
		"**Simulated:**",
		"**Simulated:** task work (sleeps); disks | pipes & &lt;tags>.",
		"1,234,567",
		"20,576 /s",
		"12.25 ms",
		"300.0 MiB",
		"≤1: 5, ≤4: 7, ≤8: 1",
		"heartbeat: 1, session: 3",
		"- task 7 ran twice",
		"## Leader CPU profile (top)",
		"```text\n",
		"![events/s and p99 append latency over time](capacity-small.svg)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown() lacks %q:\n%s", want, md)
		}
	}

	empty := (&Report{}).Markdown()
	for _, want := range []string{"Simulated", "none", "](capacity-.svg)"} {
		if !strings.Contains(empty, want) {
			t.Errorf("empty Markdown() lacks %q:\n%s", want, empty)
		}
	}
	if strings.Contains(empty, "Leader CPU profile") {
		t.Errorf("empty Markdown() has a profile section")
	}
}

func TestReportSVG(t *testing.T) {
	svg := renderTestReport().SVG()
	renderParseXML(t, svg)
	for _, want := range []string{"<polyline", "stroke-dasharray", "kill leader &lt;n1&gt; &amp; co",
		"warren capacity (preset small): events/s and p99 append latency"} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG() lacks %q", want)
		}
	}
	if n := strings.Count(svg, "<polyline"); n != 2 {
		t.Errorf("SVG() has %d polylines, want 2", n)
	}

	for name, r := range map[string]*Report{
		"empty":  {},
		"zeroes": {Timeline: []Sample{{T: 0}, {T: 0}}},
		"single": {Timeline: []Sample{{T: 5, EventsPerSec: 10, P99Ms: 0}}, Marks: []Mark{{T: 5, Label: "x"}}},
	} {
		svg := r.SVG()
		renderParseXML(t, svg)
		if strings.Contains(svg, "NaN") || strings.Contains(svg, "Inf") {
			t.Errorf("%s SVG() holds NaN or Inf:\n%s", name, svg)
		}
	}
}

func TestRenderHelpers(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", -1234567: "-1,234,567", 123456: "123,456"} {
		if got := renderThousands(n); got != want {
			t.Errorf("renderThousands(%d) = %q, want %q", n, got, want)
		}
	}
	for v, want := range map[float64]string{512: "512 B", 1536: "1.50 KiB", 300 << 20: "300.0 MiB", 1 << 30: "1.00 GiB"} {
		if got := renderBytes(v); got != want {
			t.Errorf("renderBytes(%v) = %q, want %q", v, got, want)
		}
	}
	ticks := renderNiceTicks(0, 20576, 6)
	if ticks[0] != 0 || ticks[len(ticks)-1] < 20576 || len(ticks) < 3 {
		t.Errorf("renderNiceTicks(0, 20576) = %v", ticks)
	}
	if got := renderNiceTicks(0, 0, 6); len(got) < 2 || got[len(got)-1] <= got[0] {
		t.Errorf("renderNiceTicks(0, 0) = %v", got)
	}
}
