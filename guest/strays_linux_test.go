package guest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The strays are killed once the last running command ends (right after
// its answer), never while one runs.
func TestKillStraysWhenNoCommandRuns(t *testing.T) {
	sys := &fakeSys{}
	c := pair(t, sys)
	ctx := context.Background()
	strays := func() int {
		sys.mu.Lock()
		defer sys.mu.Unlock()
		return sys.strays
	}
	waitStrays := func(want int) {
		t.Helper()
		for range 200 {
			if strays() == want {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("KillStrays called %d times, want %d", strays(), want)
	}
	dir := t.TempDir()
	running, gate := filepath.Join(dir, "running"), filepath.Join(dir, "gate")
	long := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c",
			"touch " + running + "; while [ ! -e " + gate + " ]; do sleep 0.01; done"}}, nil, nil)
		long <- err
	}()
	for i := 0; ; i++ {
		if _, err := os.Stat(running); err == nil {
			break
		}
		if i == 500 {
			t.Fatal("the long command did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Other commands end while the first still runs: no kill.
	for range 3 {
		if res, err := c.Exec(ctx, ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil || res.ExitCode != 0 {
			t.Fatal(res, err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if n := strays(); n != 0 {
		t.Fatalf("KillStrays called %d times while a command ran", n)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-long; err != nil {
		t.Fatal(err)
	}
	waitStrays(1)
	// A command that does not start leaves nothing to kill.
	if _, err := c.Exec(ctx, ExecRequest{Argv: []string{"/nonexistent/x"}}, nil, nil); err == nil {
		t.Fatal("exec of a missing program succeeded")
	}
	time.Sleep(50 * time.Millisecond)
	if n := strays(); n != 1 {
		t.Fatalf("KillStrays called %d times after a command that did not start, want 1", n)
	}
	if _, err := c.Exec(ctx, ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil {
		t.Fatal(err)
	}
	waitStrays(2)
}

// A command's child that left its process group (setsid) does not
// outlive the call: the commands' cgroup is killed once no command runs.
// The test makes a cgroup v2 of its own, as the guest's init does.
func TestExecSetsidChildKilledWithCgroup(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid program:", err)
	}
	cg := testCgroup(t)
	sys, err := NewLinuxSystem(cg)
	if err != nil {
		t.Fatal(err)
	}
	c := pair(t, sys)
	pidFile := filepath.Join(t.TempDir(), "pid")
	res, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c",
		"setsid sleep 30 </dev/null >/dev/null 2>&1 & echo $! > " + pidFile}}, nil, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatal(res, err)
	}
	assertGone(t, pidFile)
	b, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	if s := strings.TrimSpace(string(b)); s != "" {
		// Killed processes leave the cgroup once reaped; give them a moment.
		time.Sleep(200 * time.Millisecond)
		if b, _ = os.ReadFile(filepath.Join(cg, "cgroup.procs")); strings.TrimSpace(string(b)) != "" {
			t.Fatalf("processes left in the commands' cgroup: %q", b)
		}
	}
}

// testCgroup makes a cgroup v2 of the test's own, as the guest's init
// does for the commands, and removes it (killing what is left) at the end.
func testCgroup(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a cgroup")
	}
	var root string
	for _, p := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			root = p
			break
		}
	}
	if root == "" {
		t.Skip("no cgroup v2 hierarchy mounted")
	}
	cg, err := os.MkdirTemp(root, "warren-test-")
	if err != nil {
		t.Skip("cannot make a cgroup:", err)
	}
	t.Cleanup(func() {
		_ = os.WriteFile(filepath.Join(cg, "cgroup.kill"), []byte("1"), 0o644)
		for range 100 {
			if os.Remove(cg) == nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	return cg
}

// KillStrays returns once the killed no longer run: a signal is only
// delivered when its target next runs, and the next command, which waits
// for KillStrays, must not find one alive.
func TestKillStraysWaitsUntilTheyAreDead(t *testing.T) {
	cg := testCgroup(t)
	sys, err := NewLinuxSystem(cg)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 5 {
		var cmds []*exec.Cmd
		for range 40 {
			cmd := exec.Command("sleep", "30")
			cmd.SysProcAttr = sys.ExecAttr()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			cmds = append(cmds, cmd)
		}
		if err := sys.KillStrays(); err != nil {
			t.Fatal(err)
		}
		alive := 0
		for _, cmd := range cmds {
			if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)); err == nil && !isZombie(st) {
				alive++
			}
		}
		for _, cmd := range cmds {
			_ = cmd.Wait()
		}
		if alive > 0 {
			t.Fatalf("round %d: %d of %d killed processes still ran when KillStrays returned", round, alive, len(cmds))
		}
	}
}

func TestIsZombie(t *testing.T) {
	for stat, want := range map[string]bool{
		"12 (sleep) S 1 12":   false,
		"12 (sleep) Z 1 12":   true,
		"12 (a) Z (b) R 1 12": false,
		"12 (a) R (b) Z 1 12": true,
		"12 (x) X 1":          true,
		"12 (x)":              false,
		"":                    false,
	} {
		if got := isZombie([]byte(stat)); got != want {
			t.Errorf("isZombie(%q) = %v, want %v", stat, got, want)
		}
	}
}

// A command that ends on its own as its timeout fires is not reported as
// timed out: the timer's kill must be what ended it (exit 0 with
// timed_out was reported for about one in seven such runs).
func TestExecEndingAtItsTimeoutIsNotTimedOut(t *testing.T) {
	c := pair(t, &fakeSys{})
	for i := range 300 {
		res, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"true"}, Timeout: time.Duration(1+i%6) * time.Millisecond}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.TimedOut != (res.Signal == int(unix.SIGKILL)) {
			t.Fatalf("run %d: exit %d signal %d timed out %v: timed out must mean killed by the timeout", i, res.ExitCode, res.Signal, res.TimedOut)
		}
	}
}
