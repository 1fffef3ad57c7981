package noded

import (
	"os"
	"path/filepath"
	"testing"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded/driver/sim"
)

// A node starts without the task workspaces its last run left: a task
// that moved elsewhere while the node was down (a new lease epoch) has no
// actor here to remove its checkout, and each such checkout stayed on the
// node's disk for good.
func TestStartRemovesTheLastRunsWorkspaces(t *testing.T) {
	dir := t.TempDir()
	left := filepath.Join(workRoot(dir), "01TASK-e3")
	if err := os.MkdirAll(filepath.Join(left, "src"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(left, "src", "big.go"), []byte("package big\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := Start(Config{ID: "n1", DataDir: dir, Servers: []string{"http://127.0.0.1:1"}, Driver: sim.New(sim.Config{}),
		Capacity: &warrenv1.Resources{MilliCpu: 1000, MemoryBytes: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("the last run's workspace %s is still there after Start (%v)", left, err)
	}
}
