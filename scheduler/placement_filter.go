package scheduler

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// classFor returns the static filtering for t's driver, template and
// labels, computing it on first use.
func (p *placer) classFor(t *PendingTask) *nodeClass {
	key := nodeClassKey{driver: t.Driver, template: t.Template, labels: selectorKey(t.Labels)}
	if c, ok := p.classes[key]; ok {
		return c
	}
	c := &nodeClass{key: key, last: -1}
	wl := p.warmSlots(warmTemplate(t))
	for i := range p.nodes {
		f := p.check(i, t)
		if f < numExclusions {
			c.excluded[f]++
			continue
		}
		c.static = append(c.static, i)
		if wl[i] > 0 {
			c.warm = append(c.warm, i)
		}
	}
	p.classes[key] = c
	return c
}

// warmSlots returns the free warm slots of template per node, shared by
// every class naming the template.
func (p *placer) warmSlots(template string) []int32 {
	if wl, ok := p.warmLeft[template]; ok {
		return wl
	}
	wl := make([]int32, len(p.nodes))
	for i := range p.nodes {
		wl[i] = int32(min(max(p.nodes[i].WarmTemplates[template], 0), 1<<30))
	}
	p.warmLeft[template] = wl
	return wl
}

// check returns the first static filter node i fails for t, or
// numExclusions if it passes them all. Capacity is checked separately.
func (p *placer) check(i int, t *PendingTask) exclusion {
	nd := &p.nodes[i]
	switch {
	case nd.Status == NodeDown:
		return exclDown
	case nd.Status == NodeDraining:
		return exclDraining
	case nd.Status != NodeReady:
		return exclUnknown
	case !nd.Eligible:
		return exclIneligible
	case !slices.Contains(nd.Drivers, t.Driver):
		return exclDriver
	case t.Template != "" && !slices.Contains(nd.Templates, t.Template):
		return exclTemplate
	case !hasLabels(nd.Labels, t.Labels):
		return exclLabels
	}
	return numExclusions
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// selectorKey renders a label selector canonically and unambiguously:
// sorted, Go-quoted k=v pairs (`"zone"="a" "gpu"="1"`).
func selectorKey(labels map[string]string) string {
	if len(labels) == 0 {
		return ""
	}
	pairs := make([]string, 0, len(labels))
	for k, v := range labels {
		pairs = append(pairs, strconv.Quote(k)+"="+strconv.Quote(v))
	}
	slices.Sort(pairs)
	return strings.Join(pairs, " ")
}

// selectorText renders a label selector for people: "gpu=1,zone=a".
func selectorText(labels map[string]string) string {
	pairs := make([]string, 0, len(labels))
	for k, v := range labels {
		pairs = append(pairs, k+"="+v)
	}
	slices.Sort(pairs)
	return strings.Join(pairs, ",")
}

// reason explains why no node took t: every node counted under the first
// exclusion it fails, biggest count first.
func (p *placer) reason(c *nodeClass, t *PendingTask) string {
	if len(p.nodes) == 0 {
		return "no nodes"
	}
	counts := c.excluded
	// No listed node fits, else t would be placed.
	counts[exclCapacity] = len(c.static)
	type item struct {
		f exclusion
		n int
	}
	var items []item
	for f, n := range counts {
		if n > 0 {
			items = append(items, item{exclusion(f), n})
		}
	}
	slices.SortStableFunc(items, func(a, b item) int { return cmp.Compare(b.n, a.n) })
	var b strings.Builder
	b.WriteString("no node fits: ")
	for j, it := range items {
		if j > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d %s", it.n, describeExclusion(it.f, t))
	}
	return b.String()
}

func describeExclusion(f exclusion, t *PendingTask) string {
	switch f {
	case exclUnknown:
		return "in unknown status"
	case exclDown:
		return "down"
	case exclDraining:
		return "draining"
	case exclIneligible:
		return "ineligible"
	case exclDriver:
		return "without driver " + t.Driver
	case exclTemplate:
		return "without template " + t.Template
	case exclLabels:
		return "without labels " + selectorText(t.Labels)
	case exclCapacity:
		return fmt.Sprintf("without room for cpu=%dm mem=%s", t.Needs.MilliCPU, formatBytes(t.Needs.MemoryBytes))
	}
	return "excluded"
}

// formatBytes renders n in the largest binary unit that divides it exactly
// ("512MiB", "3GiB", "1000B").
func formatBytes(n int64) string {
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.size == 0 {
			return fmt.Sprintf("%d%s", n/u.size, u.suffix)
		}
	}
	return fmt.Sprintf("%dB", n)
}
