//go:build linux

package guest

import (
	"context"
	"io"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// A read of a file that waits for data (/proc/kmsg: a regular file of
// size 0 that blocks until the kernel logs) ends in the agent when the
// host gives up on the call. Before, the agent's goroutine and descriptor
// waited on for the next kernel message, after the host had gone.
func TestReadOfAWaitingFileEndsWithTheCall(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: /proc/kmsg is root's")
	}
	f, err := os.Open("/proc/kmsg")
	if err != nil {
		t.Skipf("/proc/kmsg: %v", err)
	}
	f.Close()
	c := pair(t, &fakeSys{})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.ReadFile(ctx, "/proc/kmsg", 0, io.Discard)
	if err == nil {
		t.Fatal("a read of /proc/kmsg ended without an error")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the call took %v", d)
	}
	// The agent's read ends too.
	deadline := time.Now().Add(3 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "(*Server).read(") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent still reads /proc/kmsg 3 s after the host gave up:\n%s", stacks)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
