package raftlog

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/hashicorp/raft"
)

// failingFS wraps an in-memory filesystem so that, once fail is set, every
// operation that match accepts fails with errorfs.ErrInjected.
func failingFS(fail *atomic.Bool, match func(errorfs.Op) bool) vfs.FS {
	return errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if fail.Load() && match(op) {
			return errorfs.ErrInjected
		}
		return nil
	}))
}

// TestReadError checks that a failing sstable read comes back from GetLog
// and Get as that error, not as "not found".
func TestReadError(t *testing.T) {
	var fail atomic.Bool
	fs := failingFS(&fail, func(op errorfs.Op) bool {
		return strings.HasSuffix(op.Path, ".sst") && op.Kind.ReadOrWrite() == errorfs.OpIsRead
	})
	d := openTestDB(t, fs, "db")
	s, _ := New(d.db)
	storeRange(t, s, 1, 10)
	if err := s.SetUint64([]byte("CurrentTerm"), 3); err != nil {
		t.Fatal(err)
	}
	if err := d.db.Flush(); err != nil {
		t.Fatal(err)
	}
	s = d.reopen() // empty block cache: reads go to the sstable
	wantBounds(t, s, 1, 10)

	fail.Store(true)
	var l raft.Log
	if err := s.GetLog(5, &l); !errors.Is(err, errorfs.ErrInjected) {
		t.Errorf("GetLog with failing reads = %v, want injected error", err)
	}
	if _, err := s.GetUint64([]byte("CurrentTerm")); !errors.Is(err, errorfs.ErrInjected) || err.Error() == "not found" {
		t.Errorf("GetUint64 with failing reads = %v, want injected error", err)
	}
	fail.Store(false)
	if err := s.GetLog(5, &l); err != nil {
		t.Errorf("GetLog after reads recover: %v", err)
	}
}

const walFailChildEnv = "RAFTLOG_WAL_FAIL_CHILD"

// TestWALFailureChild is the child side of TestWALFailureIsFatal.
func TestWALFailureChild(t *testing.T) {
	if os.Getenv(walFailChildEnv) == "" {
		t.Skip("only run as a child of TestWALFailureIsFatal")
	}
	var fail atomic.Bool
	fs := failingFS(&fail, func(op errorfs.Op) bool {
		return strings.HasSuffix(op.Path, ".log") &&
			(op.Kind == errorfs.OpFileWrite || op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData)
	})
	db, err := OpenWithFS("db", fs)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(db)
	if err != nil {
		t.Fatal(err)
	}
	storeRange(t, s, 1, 10)
	fail.Store(true)
	err = s.StoreLogs([]*raft.Log{testLog(11)})
	fmt.Printf("StoreLogs returned: %v\n", err)
}

// TestWALFailureIsFatal documents how a failed WAL write or sync surfaces:
// Pebble cannot tell what reached the disk, so it logs "fatal commit error"
// and exits the process instead of returning an error that a caller might
// retry. StoreLogs therefore never returns after such a failure, and a
// restarted server recovers from what is on disk.
func TestWALFailureIsFatal(t *testing.T) {
	if os.Getenv(walFailChildEnv) != "" {
		t.Skip("child process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestWALFailureChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), walFailChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() <= 0 {
		t.Fatalf("child = %v, want a non-zero exit; output:\n%s", err, out)
	}
	if strings.Contains(string(out), "StoreLogs returned") || !strings.Contains(string(out), "fatal commit error") {
		t.Fatalf("want a fatal commit error and no return from StoreLogs; output:\n%s", out)
	}
}
