package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// simCluster makes nNodes simulated nodes (driver "sim", the in-memory
// driver used for control-plane capacity runs; nothing is started) in three
// zones, 16 cores and 64 GiB each, a quarter of them half used, with warm
// pools of py and go; and nTasks tasks of 500m/1GiB, three quarters naming
// a template, one in twenty avoiding a node.
func simCluster(nNodes, nTasks int) ([]PlacementNode, []PendingTask) {
	zones := []string{"a", "b", "c"}
	templates := []string{"", "py", "go", "node"}
	nodes := make([]PlacementNode, nNodes)
	for i := range nodes {
		n := &nodes[i]
		n.ID = fmt.Sprintf("sim%04d", i)
		n.Status, n.Eligible = NodeReady, true
		n.Drivers = []string{"sim"}
		n.Templates = []string{"py", "go", "node"}
		n.WarmTemplates = map[string]int{"py": 2, "go": 1}
		n.Capacity = Resources{MilliCPU: 16000, MemoryBytes: 64 << 30}
		if i%4 == 0 {
			n.Allocated = Resources{MilliCPU: 8000, MemoryBytes: 32 << 30}
		}
		n.Labels = map[string]string{"zone": zones[i%len(zones)]}
	}
	tasks := make([]PendingTask, nTasks)
	for i := range tasks {
		tk := &tasks[i]
		tk.ID = fmt.Sprintf("task%05d", i)
		tk.Driver = "sim"
		tk.Template = templates[i%len(templates)]
		tk.Needs = Resources{MilliCPU: 500, MemoryBytes: 1 << 30}
		if i%20 == 0 {
			tk.AvoidNode = nodes[(i*7)%nNodes].ID
		}
	}
	return nodes, tasks
}

// BenchmarkPlace10kTasks500Nodes places 10,000 pending tasks over 500
// simulated nodes in one Place call, with the default config (sampling, as
// 500 > SampleAbove) and zone spreading, and reports placements per second.
func BenchmarkPlace10kTasks500Nodes(b *testing.B) {
	benchPlace(b, PlacementConfig{SpreadLabel: "zone"})
}

// BenchmarkPlace10kTasks500NodesFullScan is the same with sampling off:
// every feasible node is scored for every task.
func BenchmarkPlace10kTasks500NodesFullScan(b *testing.B) {
	benchPlace(b, PlacementConfig{SpreadLabel: "zone", SampleAbove: 1 << 30})
}

func benchPlace(b *testing.B, cfg PlacementConfig) {
	nodes, tasks := simCluster(500, 10_000)
	placed := 0
	seed := uint64(0)
	b.ReportAllocs()
	for b.Loop() {
		seed++
		plan := Place(nodes, tasks, cfg, rand.New(rand.NewPCG(seed, 0)))
		placed += len(plan.Placements)
	}
	if placed == 0 {
		b.Fatal("nothing placed")
	}
	b.ReportMetric(float64(placed)/b.Elapsed().Seconds(), "placements/s")
}
