package guest

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// lateWriter takes its first write only after a pause, then every other
// at once: a host that stops reading a command's output for a while
// (its own client is slow) while the command ends.
type lateWriter struct {
	pause time.Duration
	n     atomic.Int64
}

func (w *lateWriter) Write(p []byte) (int, error) {
	if w.n.Load() == 0 {
		time.Sleep(w.pause)
	}
	w.n.Add(int64(len(p)))
	return len(p), nil
}

// A command's whole output reaches a host that reads it late, however
// long after the command's end. Before, the agent gave the output 500 ms
// past the command's exit (meant for background children holding the
// pipes open), then dropped what was still in the pipe, and reported the
// command's exit code 0 all the same.
func TestExecOutputReachesALateHostWhole(t *testing.T) {
	c := pair(t, &fakeSys{})
	w := &lateWriter{pause: 1500 * time.Millisecond}
	// More than the stream's window (256 KiB) and the copy's buffer, so
	// the command ends with the rest in its pipe while the host waits.
	const size = 300_000
	res, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"head", "-c", "300000", "/dev/zero"}}, w, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
	if got := w.n.Load(); got != size {
		t.Fatalf("%d bytes of output reached the host, want %d", got, size)
	}
}

// A child that left the command's process group and keeps its output open
// does not hold the call past its leader's end, beyond a moment: neither
// one that is silent, nor one that writes on, fast or slowly (a read that
// waited 500 ms for more, again after each write, held the call for as
// long as a slow writer ran).
func TestExecDoesNotWaitForAStrayHoldingItsOutput(t *testing.T) {
	for _, stray := range []string{"sleep 5", "yes", "sh -c \"while :; do echo tick; sleep 0.3; done\""} {
		t.Run(strings.Fields(stray)[0], func(t *testing.T) {
			c := pair(t, &fakeSys{})
			pidFile := filepath.Join(t.TempDir(), "pid")
			defer func() {
				b, _ := os.ReadFile(pidFile)
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}()
			start := time.Now()
			res, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c",
				"setsid sh -c 'echo $$ > " + pidFile + "; exec " + stray + "' & " +
					"while [ ! -s " + pidFile + " ]; do sleep 0.01; done; echo started"}}, io.Discard, io.Discard)
			if err != nil || res.ExitCode != 0 {
				t.Fatal(res, err)
			}
			if took := time.Since(start); took > 4*time.Second {
				t.Fatalf("the call took %v: it waited for the stray that holds its output", took)
			}
		})
	}
}
