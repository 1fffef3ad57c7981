package raftlog

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// Environment of the crash child process.
const (
	crashChildEnv = "RAFTLOG_CRASH_CHILD_DIR" // store directory; selects child mode
	crashSeedEnv  = "RAFTLOG_CRASH_SEED"      // seed of the child's batch sizes
	crashSeedFlag = "RAFTLOG_CRASH_TEST_SEED" // parent: replay a run with this seed
)

// crashData is the payload of entry i: 16..527 bytes derived from i alone,
// ending in a CRC of the rest, so the parent can check any entry it reads.
func crashData(i uint64) []byte {
	r := rand.New(rand.NewPCG(i, 0x5eed))
	b := make([]byte, 12+r.IntN(512))
	for j := range b {
		b[j] = byte(r.Uint32())
	}
	return fmt.Appendf(b, "%08x", crc32.ChecksumIEEE(b))[:len(b)+4]
}

func crashLog(i uint64) *raft.Log {
	return &raft.Log{Index: i, Term: i/1000 + 1, Type: raft.LogCommand, Data: crashData(i)}
}

// TestCrashChild is the child side of TestCrashRecovery; it does nothing
// unless started by it. It appends entries in batches of random size from
// LastIndex+1 and, every so often, truncates the head of the log. After
// each write returns it prints one line to stdout:
//
//	open <last>   after opening
//	ack <last>    after StoreLogs of a batch ending at <last> returned nil
//	del <hi>      after DeleteRange(first, hi) returned nil
//
// It runs until it is killed.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashChildEnv)
	if dir == "" {
		t.Skip("only run as a child of TestCrashRecovery")
	}
	seed, err := strconv.ParseUint(os.Getenv(crashSeedEnv), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", crashSeedEnv, err)
	}
	r := rand.New(rand.NewPCG(seed, 1))
	db, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(db)
	if err != nil {
		t.Fatal(err)
	}
	last, _ := s.LastIndex()
	fmt.Fprintf(os.Stdout, "open %d\n", last) // os.Stdout is unbuffered
	for batches := 1; ; batches++ {
		n := 1 + r.IntN(64)
		logs := make([]*raft.Log, n)
		for j := range logs {
			logs[j] = crashLog(last + 1 + uint64(j))
		}
		if err := s.StoreLogs(logs); err != nil {
			t.Fatal(err)
		}
		last += uint64(n)
		fmt.Fprintf(os.Stdout, "ack %d\n", last)
		if batches%20 == 0 && last > 200 {
			first, _ := s.FirstIndex()
			hi := last - 100 - uint64(r.IntN(100))
			if err := s.DeleteRange(first, hi); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(os.Stdout, "del %d\n", hi)
		}
	}
}

// TestCrashRecovery SIGKILLs a child process that is writing to a store at
// a random moment, reopens the store, and checks that every acknowledged
// write survived and the log is contiguous and intact. It repeats for a few
// rounds on the same directory.
func TestCrashRecovery(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("child process")
	}
	if testing.Short() {
		t.Skip("starts child processes")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(crashSeedFlag); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s: %v", crashSeedFlag, err)
		}
	}
	t.Logf("seed %d (replay with %s=%d)", seed, crashSeedFlag, seed)
	r := rand.New(rand.NewPCG(seed, 2))
	dir := t.TempDir()

	var acked, deleted uint64 // highest acknowledged append and head deletion
	for round := range 5 {
		delay := time.Duration(50+r.IntN(251)) * time.Millisecond
		lines := runCrashChild(t, dir, r.Uint64(), delay)
		for _, l := range lines {
			kind, v, ok := parseCrashLine(l)
			if !ok {
				t.Fatalf("round %d: bad line from child: %q", round, l)
			}
			switch kind {
			case "open":
				if v != acked {
					t.Fatalf("round %d: child opened at LastIndex %d, want %d", round, v, acked)
				}
			case "ack":
				acked = max(acked, v)
			case "del":
				deleted = max(deleted, v)
			}
		}
		first, last := checkCrashStore(t, dir, acked, deleted)
		t.Logf("round %d: killed after %v; %d lines; log [%d, %d], acknowledged %d, deleted through %d",
			round, delay, len(lines), first, last, acked, deleted)
		// Writes that were durable but not acknowledged count from now on.
		acked = last
	}
}

// runCrashChild runs TestCrashChild on dir, waits until it has opened the
// store, kills it with SIGKILL after delay, and returns what it printed.
func runCrashChild(t *testing.T, dir string, seed uint64, delay time.Duration) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, fmt.Sprintf("%s=%d", crashSeedEnv, seed))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	opened := make(chan struct{})
	done := make(chan []string)
	go func() {
		var lines []string
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if len(lines) == 1 {
				close(opened)
			}
		}
		done <- lines
	}()
	select {
	case <-opened:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		cmd.Wait()
		t.Fatalf("child did not open the store; stderr:\n%s", stderr.String())
	}
	time.Sleep(delay) // the moment of the crash, not a wait for a condition
	if err := cmd.Process.Kill(); err != nil {
		t.Fatalf("kill: %v", err)
	}
	lines := <-done
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != -1 {
		// The child exits only by being killed (ExitCode -1 for a signal).
		t.Fatalf("child exited before the kill: %v; stderr:\n%s", err, stderr.String())
	}
	return lines
}

func parseCrashLine(l string) (kind string, v uint64, ok bool) {
	kind, num, ok := strings.Cut(l, " ")
	if !ok || (kind != "open" && kind != "ack" && kind != "del") {
		return "", 0, false
	}
	v, err := strconv.ParseUint(num, 10, 64)
	return kind, v, err == nil
}

// checkCrashStore reopens the store in dir and checks it against what the
// child acknowledged: every append up to acked is present unless it was
// deleted, the head deletion up to deleted happened, and every entry from
// FirstIndex to LastIndex is present and intact.
func checkCrashStore(t *testing.T, dir string, acked, deleted uint64) (first, last uint64) {
	t.Helper()
	db, err := Open(dir)
	if err != nil {
		t.Fatalf("reopen after crash: %v", err)
	}
	defer db.Close()
	s, err := New(db)
	if err != nil {
		t.Fatalf("New after crash: %v", err)
	}
	first, _ = s.FirstIndex()
	last, _ = s.LastIndex()
	if last < acked {
		t.Fatalf("LastIndex %d < acknowledged %d", last, acked)
	}
	if deleted > 0 && first <= deleted {
		t.Fatalf("FirstIndex %d, but the child acknowledged deleting through %d", first, deleted)
	}
	// The child never deletes the last 100 entries, so acknowledged
	// appends past the deletions are in the log.
	if acked > 0 && (first == 0 || first > acked) {
		t.Fatalf("FirstIndex %d, but %d was acknowledged", first, acked)
	}
	for i := first; i != 0 && i <= last; i++ {
		var l raft.Log
		if err := s.GetLog(i, &l); err != nil {
			t.Fatalf("GetLog(%d) in [%d, %d]: %v", i, first, last, err)
		}
		if want := crashLog(i); !logsEqual(&l, want) {
			t.Fatalf("entry %d is not what was written: %+v", i, l)
		}
	}
	// Nothing outside the bounds.
	var l raft.Log
	for _, i := range []uint64{first - 1, last + 1} {
		if i != 0 {
			if err := s.GetLog(i, &l); !errors.Is(err, raft.ErrLogNotFound) {
				t.Fatalf("GetLog(%d) outside [%d, %d] = %v", i, first, last, err)
			}
		}
	}
	return first, last
}
