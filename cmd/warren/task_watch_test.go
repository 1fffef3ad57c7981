package main

import (
	"bytes"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/freeaddr"
)

// watchEnded maps the state a watched task ended in to the exit status of
// `warren task watch`: 0 succeeded, 1 failed, 2 cancelled, with a note on
// stderr for the non-zero ones.
func TestWatchEndedExitCodes(t *testing.T) {
	for _, c := range []struct {
		state string
		code  int
	}{{"succeeded", 0}, {"failed", 1}, {"cancelled", 2}} {
		var errb bytes.Buffer
		err := watchEnded(&errb, "t1", c.state)
		var code exitCode
		got := 0
		if errors.As(err, &code) {
			got = int(code)
		} else if err != nil {
			t.Fatalf("%s: %v, want an exitCode", c.state, err)
		}
		if got != c.code || (c.code != 0) != strings.Contains(errb.String(), "task t1 ended "+c.state) {
			t.Errorf("%s: exit status %d, stderr %q; want %d", c.state, got, errb.String(), c.code)
		}
	}
}

// The warren process watching a task that fails exits 1, both when it
// watches the failing state change and when --after starts past it (the
// state is then asked for).
func TestWatchExitsNonZeroOnFailedTask(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server process")
	}
	api := freeaddr.Loopback(t)
	_, port, _ := net.SplitHostPort(api)
	if p, _ := strconv.Atoi(port); p >= 65534 {
		t.Skip("no room for the raft port")
	}
	dev := exec.Command(warrenBin, "dev", "--data", filepath.Join(t.TempDir(), "dev"), "--api", api,
		"--raft", freeaddr.Loopback(t), "--log-level", "warn")
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Process.Kill(); dev.Wait() })
	server := "--server=http://" + api
	warren := func(args ...string) (string, string, int) {
		cmd := exec.Command(warrenBin, append(args, server)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
		return out.String(), errb.String(), cmd.ProcessState.ExitCode()
	}
	waitUntil(t, "dev to serve", 20*time.Second, func() bool {
		out, _, code := warren("nodes", "list")
		return code == 0 && strings.Contains(out, "ready")
	})
	script, _ := filepath.Abs("../../deploy/demo/model.jsonl")
	// An agent task on the sim driver fails at once: sim sandboxes have
	// no guest to run tools in.
	out, errb, code := warren("task", "create", "--repo", "/nonexistent/repo", "--base", "main", "--title", "t",
		"--driver", "sim", "--model-script", script, "-q")
	if code != 0 {
		t.Fatalf("create: exit status %d %s", code, errb)
	}
	id := strings.TrimSpace(out)
	out, errb, code = warren("task", "watch", id)
	if !strings.Contains(out, "failed: agent") {
		t.Fatalf("the task did not fail:\n%s", out)
	}
	if code != 1 || !strings.Contains(errb, "ended failed") {
		t.Errorf("watch of a failed task: exit status %d, stderr %q; want 1", code, errb)
	}
	last := strings.Count(out, "\n")
	out, errb, code = warren("task", "watch", id, "--after", strconv.Itoa(last))
	if out != "" || code != 1 {
		t.Errorf("watch --after %d of a failed task: exit status %d, stderr %q, stdout %q; want 1 and no events", last, code, errb, out)
	}
}

// `warren task watch` with no server answering ends with the last error
// once --timeout has passed without a stream; it printed "reconnecting"
// every 2 s for good, so `warren task watch "$ID" && next` hung.
func TestWatchWithNoServerEnds(t *testing.T) {
	dead := "http://" + freeaddr.Loopback(t) // nothing listens there
	done := make(chan error, 1)
	var out, errb bytes.Buffer
	go func() {
		done <- run([]string{"task", "watch", "01J00000000000000000000000", "--server", dead, "--timeout", "1s"}, &out, &errb)
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "unavailable") {
			t.Errorf("task watch with no server: %v, want the last unavailable", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("task watch with no server and --timeout 1s still running after 15 s")
	}
}
