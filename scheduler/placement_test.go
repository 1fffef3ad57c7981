package scheduler

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"pgregory.net/rapid"
)

// TestPlacement runs the scenarios in testdata/placement. Commands:
//
//	nodes                  one node a line (replaces the node set):
//	                       ID [status=ready|down|draining|unknown] [ineligible]
//	                       [drivers=a,b] [templates=a,b] [warm=tmpl:n,...]
//	                       [cap=CPU/MEM] [used=CPU/MEM] [label=value...]
//	                       defaults: ready, eligible, drivers=sim,
//	                       cap=4000/8G, used=0/0; CPU in millicores, MEM in
//	                       bytes or with K, M, G (binary) suffix.
//	gen-nodes count=N [prefix=n] [zones=a,b,c] [used-every=K] [append] and
//	                       the node keys above as arguments: N numbered
//	                       nodes (zones round-robin; used= only on every
//	                       K-th node), replacing the node set or appended.
//	tasks                  one task a line (replaces the task list):
//	                       ID [driver=sim] [template=t] [needs=CPU/MEM]
//	                       [avoid=node] [label=value...] (a node selector)
//	                       defaults: driver=sim, needs=1000/1G.
//	gen-tasks count=N [prefix=t] and the task keys above as arguments.
//	place [seed=N] [spread=label] [sample-above=N] [k=N] [usage] [summary]
//	                       runs Place and prints the plan (or, with summary,
//	                       counts); usage adds each used node's load.
//
// Every plan is also checked against checkPlan. Regenerate with -rewrite.
func TestPlacement(t *testing.T) {
	datadriven.Walk(t, "testdata/placement", func(t *testing.T, path string) {
		var nodes []PlacementNode
		var tasks []PendingTask
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "nodes":
				nodes = nil
				for _, line := range nonEmptyLines(d.Input) {
					f := strings.Fields(line)
					n, err := parseNode(f[0], splitKVs(f[1:]))
					if err != nil {
						d.Fatalf(t, "%s: %v", line, err)
					}
					nodes = append(nodes, n)
				}
				return fmt.Sprintf("%d nodes", len(nodes))
			case "gen-nodes":
				gen, err := genNodes(argKVs(d))
				if err != nil {
					d.Fatalf(t, "%v", err)
				}
				if !d.HasArg("append") {
					nodes = nil
				}
				nodes = append(nodes, gen...)
				return fmt.Sprintf("%d nodes", len(nodes))
			case "tasks":
				tasks = nil
				for _, line := range nonEmptyLines(d.Input) {
					f := strings.Fields(line)
					tk, err := parseTask(f[0], splitKVs(f[1:]))
					if err != nil {
						d.Fatalf(t, "%s: %v", line, err)
					}
					tasks = append(tasks, tk)
				}
				return fmt.Sprintf("%d tasks", len(tasks))
			case "gen-tasks":
				var err error
				tasks, err = genTasks(argKVs(d))
				if err != nil {
					d.Fatalf(t, "%v", err)
				}
				return fmt.Sprintf("%d tasks", len(tasks))
			case "place":
				seed := uint64(1)
				var cfg PlacementConfig
				d.MaybeScanArgs(t, "seed", &seed)
				d.MaybeScanArgs(t, "spread", &cfg.SpreadLabel)
				d.MaybeScanArgs(t, "sample-above", &cfg.SampleAbove)
				d.MaybeScanArgs(t, "k", &cfg.SampleK)
				plan := Place(nodes, tasks, cfg, rand.New(rand.NewPCG(seed, seed)))
				if err := checkPlan(nodes, tasks, plan); err != nil {
					d.Fatalf(t, "invalid plan: %v", err)
				}
				if d.HasArg("summary") {
					return summarize(nodes, tasks, plan, cfg.SpreadLabel)
				}
				return printPlan(nodes, tasks, plan, d.HasArg("usage"))
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

func nonEmptyLines(s string) []string {
	var out []string
	for l := range strings.Lines(s) {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

type kv struct{ k, v string }

func splitKVs(fields []string) []kv {
	var out []kv
	for _, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		out = append(out, kv{k, v})
	}
	return out
}

func argKVs(d *datadriven.TestData) []kv {
	var out []kv
	for _, a := range d.CmdArgs {
		out = append(out, kv{a.Key, strings.Join(a.Vals, ",")})
	}
	return out
}

func parseNode(id string, kvs []kv) (PlacementNode, error) {
	n := PlacementNode{ID: id, Status: NodeReady, Eligible: true, Drivers: []string{"sim"},
		Capacity: Resources{4000, 8 << 30}}
	for _, a := range kvs {
		var err error
		switch a.k {
		case "status":
			n.Status, err = parseStatus(a.v)
		case "ineligible":
			n.Eligible = false
		case "drivers":
			n.Drivers = splitList(a.v)
		case "templates":
			n.Templates = splitList(a.v)
		case "warm":
			n.WarmTemplates = map[string]int{}
			for _, w := range splitList(a.v) {
				tmpl, cnt, _ := strings.Cut(w, ":")
				n.WarmTemplates[tmpl], err = strconv.Atoi(cnt)
			}
		case "cap":
			n.Capacity, err = parseResources(a.v)
		case "used":
			n.Allocated, err = parseResources(a.v)
		default:
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			n.Labels[a.k] = a.v
		}
		if err != nil {
			return n, fmt.Errorf("%s=%s: %w", a.k, a.v, err)
		}
	}
	return n, nil
}

func parseTask(id string, kvs []kv) (PendingTask, error) {
	tk := PendingTask{ID: id, Driver: "sim", Needs: Resources{1000, 1 << 30}}
	for _, a := range kvs {
		var err error
		switch a.k {
		case "driver":
			tk.Driver = a.v
		case "template":
			tk.Template = a.v
		case "needs":
			tk.Needs, err = parseResources(a.v)
		case "avoid":
			tk.AvoidNode = a.v
		default:
			if tk.Labels == nil {
				tk.Labels = map[string]string{}
			}
			tk.Labels[a.k] = a.v
		}
		if err != nil {
			return tk, fmt.Errorf("%s=%s: %w", a.k, a.v, err)
		}
	}
	return tk, nil
}

// genNodes makes count nodes n0001, n0002, ... from the node keys, plus
// count, prefix, zones and used-every.
func genNodes(kvs []kv) ([]PlacementNode, error) {
	count, every, prefix := 0, 1, "n"
	var zones []string
	var rest []kv
	var used kv
	for _, a := range kvs {
		var err error
		switch a.k {
		case "count":
			count, err = strconv.Atoi(a.v)
		case "used-every":
			every, err = strconv.Atoi(a.v)
		case "prefix":
			prefix = a.v
		case "append":
		case "zones":
			zones = splitList(a.v)
		case "used":
			used = a
		default:
			rest = append(rest, a)
		}
		if err != nil {
			return nil, err
		}
	}
	nodes := make([]PlacementNode, 0, count)
	for i := range count {
		kvs := rest
		if used.k != "" && i%every == 0 {
			kvs = append(slices.Clip(kvs), used)
		}
		if len(zones) > 0 {
			kvs = append(slices.Clip(kvs), kv{"zone", zones[i%len(zones)]})
		}
		n, err := parseNode(fmt.Sprintf("%s%04d", prefix, i+1), kvs)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

func genTasks(kvs []kv) ([]PendingTask, error) {
	count, prefix := 0, "t"
	var rest []kv
	for _, a := range kvs {
		var err error
		switch a.k {
		case "count":
			count, err = strconv.Atoi(a.v)
		case "prefix":
			prefix = a.v
		default:
			rest = append(rest, a)
		}
		if err != nil {
			return nil, err
		}
	}
	tasks := make([]PendingTask, 0, count)
	for i := range count {
		tk, err := parseTask(fmt.Sprintf("%s%04d", prefix, i+1), rest)
		if err != nil {
			return nil, err
		}
		tasks = append(tasks, tk)
	}
	return tasks, nil
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func parseStatus(s string) (NodeStatus, error) {
	for _, st := range []NodeStatus{NodeStatusUnknown, NodeReady, NodeDown, NodeDraining} {
		if st.String() == s {
			return st, nil
		}
	}
	return 0, fmt.Errorf("unknown status %q", s)
}

// parseResources parses "CPU/MEM": millicores, then bytes with an optional
// K, M or G (binary) suffix.
func parseResources(s string) (Resources, error) {
	c, m, ok := strings.Cut(s, "/")
	if !ok {
		return Resources{}, fmt.Errorf("want CPU/MEM, got %q", s)
	}
	cpu, err := strconv.ParseInt(c, 10, 64)
	if err != nil {
		return Resources{}, err
	}
	mult := int64(1)
	switch {
	case strings.HasSuffix(m, "K"):
		mult = 1 << 10
	case strings.HasSuffix(m, "M"):
		mult = 1 << 20
	case strings.HasSuffix(m, "G"):
		mult = 1 << 30
	}
	if mult > 1 {
		m = m[:len(m)-1]
	}
	mem, err := strconv.ParseInt(m, 10, 64)
	return Resources{cpu, mem * mult}, err
}

func printPlan(nodes []PlacementNode, tasks []PendingTask, plan Plan, usage bool) string {
	var b strings.Builder
	for _, p := range plan.Placements {
		fmt.Fprintf(&b, "%s -> %s", p.TaskID, p.NodeID)
		if p.Warm {
			b.WriteString(" warm")
		}
		b.WriteString("\n")
	}
	if len(plan.Unplaced) > 0 {
		b.WriteString("unplaced:\n")
		for _, tk := range tasks {
			if r, ok := plan.Unplaced[tk.ID]; ok {
				fmt.Fprintf(&b, "  %s: %s\n", tk.ID, r)
			}
		}
	}
	if usage {
		b.WriteString("usage:\n")
		needs := needsByID(tasks)
		for _, n := range nodes {
			cnt, used, warm := 0, n.Allocated, 0
			for _, p := range plan.Placements {
				if p.NodeID == n.ID {
					cnt++
					used.MilliCPU += needs[p.TaskID].MilliCPU
					used.MemoryBytes += needs[p.TaskID].MemoryBytes
					if p.Warm {
						warm++
					}
				}
			}
			if cnt == 0 {
				continue
			}
			fmt.Fprintf(&b, "  %s: %d tasks (%d warm) cpu=%d/%d mem=%s/%s\n", n.ID, cnt, warm,
				used.MilliCPU, n.Capacity.MilliCPU, formatBytes(used.MemoryBytes), formatBytes(n.Capacity.MemoryBytes))
		}
	}
	if b.Len() == 0 {
		return "empty plan\n"
	}
	return b.String()
}

func summarize(nodes []PlacementNode, tasks []PendingTask, plan Plan, spread string) string {
	var b strings.Builder
	warm := 0
	perNode := map[string]int{}
	for _, p := range plan.Placements {
		perNode[p.NodeID]++
		if p.Warm {
			warm++
		}
	}
	fmt.Fprintf(&b, "placed %d of %d (%d warm) on %d of %d nodes\n", len(plan.Placements), len(tasks), warm, len(perNode), len(nodes))
	if spread != "" {
		perDomain := map[string]int{}
		for _, n := range nodes {
			perDomain[n.Labels[spread]] += perNode[n.ID]
		}
		doms := slices.Sorted(maps.Keys(perDomain))
		b.WriteString(spread + ":")
		for _, d := range doms {
			fmt.Fprintf(&b, " %s=%d", d, perDomain[d])
		}
		b.WriteString("\n")
	}
	full := 0
	needs := needsByID(tasks)
	free := map[string]Resources{}
	for _, n := range nodes {
		free[n.ID] = Resources{n.Capacity.MilliCPU - n.Allocated.MilliCPU, n.Capacity.MemoryBytes - n.Allocated.MemoryBytes}
	}
	for _, p := range plan.Placements {
		f := free[p.NodeID]
		f.MilliCPU -= needs[p.TaskID].MilliCPU
		f.MemoryBytes -= needs[p.TaskID].MemoryBytes
		free[p.NodeID] = f
	}
	for id, f := range free {
		if perNode[id] > 0 && (f.MilliCPU == 0 || f.MemoryBytes == 0) {
			full++
		}
	}
	fmt.Fprintf(&b, "nodes filled to the brim: %d\n", full)
	if len(plan.Unplaced) > 0 {
		reasons := map[string]int{}
		for _, r := range plan.Unplaced {
			reasons[r]++
		}
		fmt.Fprintf(&b, "unplaced %d:\n", len(plan.Unplaced))
		for _, r := range slices.Sorted(maps.Keys(reasons)) {
			fmt.Fprintf(&b, "  %d× %s\n", reasons[r], r)
		}
	}
	return b.String()
}

func needsByID(tasks []PendingTask) map[string]Resources {
	m := make(map[string]Resources, len(tasks))
	for _, tk := range tasks {
		m[tk.ID] = tk.Needs
	}
	return m
}

// checkPlan replays plan over nodes and tasks with a model written
// independently of Place and reports the first violation of:
//   - every task is placed exactly once or unplaced with a reason, and
//     placements come in task order;
//   - a placement's node passes every filter (capacity counted with the
//     placements before it), so no node ends over capacity;
//   - Warm is set exactly when the node had a free warm slot of the
//     template ("default" for a task without one), and warm slots are
//     never used twice;
//   - a cold placement happens only when no node but AvoidNode had a warm
//     slot and room; AvoidNode is used only when no other node fits;
//   - an unplaced task (with sane inputs) had no feasible node.
func checkPlan(nodes []PlacementNode, tasks []PendingTask, plan Plan) error {
	byID := map[string]int{}
	for i, n := range nodes {
		byID[n.ID] = i
	}
	free := make([]Resources, len(nodes))
	for i, n := range nodes {
		free[i] = Resources{n.Capacity.MilliCPU - n.Allocated.MilliCPU, n.Capacity.MemoryBytes - n.Allocated.MemoryBytes}
	}
	warmUsed := map[string]int{} // node/template
	warmTmpl := func(tk *PendingTask) string {
		if tk.Template == "" {
			return "default" // what the node claims for it
		}
		return tk.Template
	}
	warmLeft := func(i int, tk *PendingTask) int {
		return nodes[i].WarmTemplates[warmTmpl(tk)] - warmUsed[nodes[i].ID+"/"+warmTmpl(tk)]
	}
	feasible := func(i int, tk *PendingTask) bool {
		n := &nodes[i]
		if n.Status != NodeReady || !n.Eligible || !slices.Contains(n.Drivers, tk.Driver) {
			return false
		}
		if tk.Template != "" && !slices.Contains(n.Templates, tk.Template) {
			return false
		}
		for k, v := range tk.Labels {
			if got, ok := n.Labels[k]; !ok || got != v {
				return false
			}
		}
		return tk.Needs.MilliCPU <= free[i].MilliCPU && tk.Needs.MemoryBytes <= free[i].MemoryBytes
	}
	seen := map[string]bool{}
	next := 0 // index into plan.Placements
	for ti := range tasks {
		tk := &tasks[ti]
		if seen[tk.ID] {
			continue
		}
		seen[tk.ID] = true
		sane := tk.Driver != "" && tk.Needs.MilliCPU >= 0 && tk.Needs.MemoryBytes >= 0
		otherFits, otherWarm := false, false
		for i := range nodes {
			if nodes[i].ID != tk.AvoidNode && feasible(i, tk) {
				otherFits = true
				otherWarm = otherWarm || warmLeft(i, tk) > 0
			}
		}
		reason, unplaced := plan.Unplaced[tk.ID]
		placed := next < len(plan.Placements) && plan.Placements[next].TaskID == tk.ID
		switch {
		case placed && unplaced:
			return fmt.Errorf("task %s both placed and unplaced", tk.ID)
		case !placed && !unplaced:
			return fmt.Errorf("task %s neither placed nor unplaced (or placed out of order)", tk.ID)
		case unplaced:
			if reason == "" {
				return fmt.Errorf("task %s unplaced without a reason", tk.ID)
			}
			if !sane {
				continue
			}
			for i := range nodes {
				if feasible(i, tk) {
					return fmt.Errorf("task %s unplaced (%s) but node %s fits", tk.ID, reason, nodes[i].ID)
				}
			}
			continue
		}
		p := plan.Placements[next]
		next++
		if !sane {
			return fmt.Errorf("task %s placed despite invalid request", tk.ID)
		}
		i, ok := byID[p.NodeID]
		if !ok {
			return fmt.Errorf("task %s placed on unknown node %s", tk.ID, p.NodeID)
		}
		if !feasible(i, tk) {
			return fmt.Errorf("task %s placed on %s, which fails a filter (free %+v, needs %+v)", tk.ID, p.NodeID, free[i], tk.Needs)
		}
		if had := warmLeft(i, tk) > 0; p.Warm != had {
			return fmt.Errorf("task %s on %s: warm=%v but node had a free warm slot: %v", tk.ID, p.NodeID, p.Warm, had)
		}
		if p.NodeID == tk.AvoidNode && otherFits {
			return fmt.Errorf("task %s placed on its avoid node %s while another node fit", tk.ID, p.NodeID)
		}
		if !p.Warm && otherWarm {
			return fmt.Errorf("task %s placed cold on %s while a warm node fit", tk.ID, p.NodeID)
		}
		free[i].MilliCPU -= tk.Needs.MilliCPU
		free[i].MemoryBytes -= tk.Needs.MemoryBytes
		if p.Warm {
			warmUsed[p.NodeID+"/"+warmTmpl(tk)]++
		}
	}
	if next != len(plan.Placements) {
		return fmt.Errorf("%d placements for unknown or repeated tasks, first %s", len(plan.Placements)-next, plan.Placements[next].TaskID)
	}
	if n := len(plan.Unplaced); n > 0 {
		for id := range plan.Unplaced {
			if !seen[id] {
				return fmt.Errorf("unplaced entry for unknown task %s", id)
			}
		}
	}
	return nil
}

// TestPlacementProperties checks checkPlan's invariants on random clusters
// and task lists, with thresholds low enough that sampling runs too.
func TestPlacementProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		drivers := []string{"sim", "microvm", "container"}
		templates := []string{"py", "go", "node"}
		zones := []string{"a", "b", "c"}
		nNodes := rapid.IntRange(0, 24).Draw(rt, "nodes")
		nodes := make([]PlacementNode, nNodes)
		for i := range nodes {
			n := &nodes[i]
			n.ID = fmt.Sprintf("n%d", i)
			n.Status = rapid.SampledFrom([]NodeStatus{NodeReady, NodeReady, NodeReady, NodeDown, NodeDraining, NodeStatusUnknown}).Draw(rt, "status")
			n.Eligible = rapid.IntRange(0, 5).Draw(rt, "eligible") > 0
			n.Drivers = subset(rt, "drivers", drivers)
			n.Templates = subset(rt, "templates", templates)
			n.WarmTemplates = map[string]int{}
			for _, tm := range append([]string{"default"}, templates...) {
				n.WarmTemplates[tm] = rapid.IntRange(0, 2).Draw(rt, "warm")
			}
			n.Capacity = Resources{int64(rapid.IntRange(0, 8).Draw(rt, "cpu")) * 1000, int64(rapid.IntRange(0, 8).Draw(rt, "mem")) << 30}
			n.Allocated = Resources{int64(rapid.IntRange(0, 9).Draw(rt, "ucpu")) * 500, int64(rapid.IntRange(0, 9).Draw(rt, "umem")) << 29}
			n.Labels = map[string]string{"zone": rapid.SampledFrom(zones).Draw(rt, "zone")}
			if rapid.Bool().Draw(rt, "gpu") {
				n.Labels["gpu"] = "1"
			}
		}
		nTasks := rapid.IntRange(0, 60).Draw(rt, "tasks")
		tasks := make([]PendingTask, nTasks)
		for i := range tasks {
			tk := &tasks[i]
			tk.ID = fmt.Sprintf("t%d", i)
			tk.Driver = rapid.SampledFrom(drivers).Draw(rt, "driver")
			tk.Template = rapid.SampledFrom(append([]string{""}, templates...)).Draw(rt, "template")
			tk.Needs = Resources{int64(rapid.IntRange(0, 4).Draw(rt, "ncpu")) * 500, int64(rapid.IntRange(0, 4).Draw(rt, "nmem")) << 29}
			if nNodes > 0 && rapid.IntRange(0, 3).Draw(rt, "avoid?") == 0 {
				tk.AvoidNode = fmt.Sprintf("n%d", rapid.IntRange(0, nNodes-1).Draw(rt, "avoid"))
			}
			switch rapid.IntRange(0, 5).Draw(rt, "selector") {
			case 0:
				tk.Labels = map[string]string{"zone": rapid.SampledFrom(zones).Draw(rt, "szone")}
			case 1:
				tk.Labels = map[string]string{"gpu": "1"}
			}
		}
		cfg := PlacementConfig{
			SampleAbove: rapid.IntRange(0, 12).Draw(rt, "sampleAbove"),
			SampleK:     rapid.IntRange(0, 5).Draw(rt, "k"),
		}
		if rapid.Bool().Draw(rt, "spread") {
			cfg.SpreadLabel = "zone"
		}
		seed := rapid.Uint64().Draw(rt, "seed")
		plan := Place(nodes, tasks, cfg, rand.New(rand.NewPCG(seed, 0)))
		if err := checkPlan(nodes, tasks, plan); err != nil {
			rt.Fatal(err)
		}
	})
}

func subset(rt *rapid.T, label string, all []string) []string {
	var out []string
	for _, s := range all {
		if rapid.IntRange(0, 2).Draw(rt, label) > 0 {
			out = append(out, s)
		}
	}
	return out
}

// TestPlaceDeterministic: the same seed gives the same plan, also when
// sampling; the inputs are left as they were.
func TestPlaceDeterministic(t *testing.T) {
	nodes, tasks := simCluster(600, 400)
	before := slices.Clone(nodes)
	for i := range before {
		before[i].WarmTemplates = maps.Clone(nodes[i].WarmTemplates)
	}
	cfg := PlacementConfig{SpreadLabel: "zone"}
	a := Place(nodes, tasks, cfg, rand.New(rand.NewPCG(7, 7)))
	b := Place(nodes, tasks, cfg, rand.New(rand.NewPCG(7, 7)))
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same seed, different plans")
	}
	c := Place(nodes, tasks, cfg, rand.New(rand.NewPCG(8, 8)))
	if reflect.DeepEqual(a, c) {
		t.Error("different seeds gave the same plan over 600 nodes; is sampling on?")
	}
	if !reflect.DeepEqual(nodes, before) {
		t.Fatal("Place modified its nodes")
	}
	if err := checkPlan(nodes, tasks, a); err != nil {
		t.Fatal(err)
	}
}

// TestPlaceUnplacedReasons pins the reasons for invalid tasks and an empty
// cluster, which the datadriven files do not cover.
func TestPlaceUnplacedReasons(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []PlacementNode
		task  PendingTask
		want  string
	}{
		{"no nodes", nil, PendingTask{ID: "t", Driver: "sim"}, "no nodes"},
		{"no driver", []PlacementNode{{ID: "n", Status: NodeReady, Eligible: true}}, PendingTask{ID: "t"}, "task names no driver"},
		{"negative", []PlacementNode{{ID: "n", Status: NodeReady, Eligible: true, Drivers: []string{"sim"}}},
			PendingTask{ID: "t", Driver: "sim", Needs: Resources{MilliCPU: -1}}, "task needs negative resources"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := Place(tc.nodes, []PendingTask{tc.task}, PlacementConfig{}, nil)
			if got := plan.Unplaced["t"]; got != tc.want {
				t.Fatalf("reason %q, want %q", got, tc.want)
			}
		})
	}
}

// TestPlaceCapsStartsPerNode: with MaxStartingPerNode, no node is given
// more starts than the cap minus those it already has, even where
// bin-packing would fill it.
func TestPlaceCapsStartsPerNode(t *testing.T) {
	var nodes []PlacementNode
	for _, id := range []string{"a", "b", "c", "d"} {
		nodes = append(nodes, PlacementNode{ID: id, Status: NodeReady, Eligible: true, Drivers: []string{"sim"},
			Capacity: Resources{100000, 100 << 30}})
	}
	nodes[0].Starting = 2
	var tasks []PendingTask
	for i := range 20 {
		tasks = append(tasks, PendingTask{ID: fmt.Sprint("t", i), Driver: "sim", Needs: Resources{1000, 1 << 30}})
	}
	plan := Place(nodes, tasks, PlacementConfig{MaxStartingPerNode: 3}, rand.New(rand.NewPCG(1, 2)))
	per := map[string]int{}
	for _, p := range plan.Placements {
		per[p.NodeID]++
	}
	if per["a"] != 1 || per["b"] != 3 || per["c"] != 3 || per["d"] != 3 || len(plan.Unplaced) != 10 {
		t.Fatalf("placements per node %v, %d unplaced; want a:1 b:3 c:3 d:3 and 10 unplaced", per, len(plan.Unplaced))
	}
	// Without the cap, all 20 are placed.
	plan = Place(nodes, tasks, PlacementConfig{}, rand.New(rand.NewPCG(1, 2)))
	if len(plan.Placements) != 20 || len(plan.Unplaced) != 0 {
		t.Fatalf("uncapped: %d placed, %d unplaced", len(plan.Placements), len(plan.Unplaced))
	}
}

// Plan.Unfit counts the unplaced tasks no node could take even empty, not
// those that wait for room.
func TestPlanCountsUnfitTasks(t *testing.T) {
	nodes := []PlacementNode{{ID: "n", Status: NodeReady, Eligible: true, Drivers: []string{"sim"}, Capacity: Resources{2000, 4 << 30}}}
	tasks := []PendingTask{
		{ID: "fits", Driver: "sim", Needs: Resources{1500, 1 << 30}},
		{ID: "waits", Driver: "sim", Needs: Resources{1500, 1 << 30}}, // no room left after the first
		{ID: "gpu", Driver: "gpu", Needs: Resources{100, 1 << 20}},    // no node has the driver
		{ID: "nodriver", Needs: Resources{100, 1 << 20}},
		{ID: "huge", Driver: "sim", Needs: Resources{64000, 1 << 30}}, // more than the node's whole capacity
	}
	plan := Place(nodes, tasks, PlacementConfig{}, nil)
	if len(plan.Placements) != 1 || len(plan.Unplaced) != 4 || plan.Unfit != 3 {
		t.Fatalf("placed %v, unplaced %v, unfit %d; want 1 placed, 4 unplaced, 3 unfit", plan.Placements, plan.Unplaced, plan.Unfit)
	}
}
