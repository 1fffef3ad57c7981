package container

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/noded/driver"
)

// A command in a sandbox runs as root and can write to the agent's stdout
// and stderr (the container's, which the runc shim hands to the host):
// agent.log on the host keeps the first MiB of it and a note, and the rest
// is read and dropped, so the node's disk does not fill and the agent is
// not held in a write. It was a file the shim appended everything to.
func TestAgentLogIsBounded(t *testing.T) {
	d := newDriver(t)
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-agentlog"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	log := filepath.Join(sb.(*Box).dir, "agent.log")
	// 8 MiB through both streams, far past the 1 MiB kept. The writes
	// return only once the host side has read them (a pipe holds 64 KiB),
	// so the commands' end also shows that nothing blocks past the cap.
	out, code := run(t, sb, "echo first-line >/proc/1/fd/2 && head -c 4194304 /dev/zero >/proc/1/fd/1 && head -c 4194304 /dev/zero >/proc/1/fd/2 && echo written")
	if code != 0 || out != "written\n" {
		t.Fatalf("flood: exit %d %q", code, out)
	}
	// The host side writes the file after the pipe: watch it settle.
	const bound = 1<<20 + 4096 // the cap, and room for the note
	var size int64
	for i := 0; i < 20; i++ {
		fi, err := os.Stat(log)
		if err != nil {
			t.Fatal(err)
		}
		size = fi.Size()
		if size > bound {
			t.Fatalf("agent.log is %d bytes after 8 MiB of output; want at most %d", size, bound)
		}
		time.Sleep(100 * time.Millisecond)
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "first-line\n") {
		t.Errorf("agent.log (%d bytes) lost the output before the cap", len(b))
	}
	if size < 1<<20 {
		t.Errorf("agent.log is %d bytes: it kept less than the cap", size)
	}
	if tail := b[len(b)-min(len(b), 256):]; !strings.Contains(string(tail), "dropped") {
		t.Errorf("agent.log does not end with a note of what was dropped: %q", tail)
	}
	// The agent still answers, and output past the cap is still drained.
	if out, code := run(t, sb, "head -c 1048576 /dev/zero >/proc/1/fd/1 && echo alive"); code != 0 || out != "alive\n" {
		t.Fatalf("after the flood: exit %d %q", code, out)
	}
}

// An agent that does not start has the end of what it wrote quoted in the
// claim's error: all of a short message, and 4 KiB of a long one.
func TestAgentStartFailureIsQuoted(t *testing.T) {
	for _, c := range []struct {
		name, script string
		want         string
		most         int
	}{
		{"short", "echo 'warren-guest: listen: no good' >&2; exit 1", "warren-guest: listen: no good", 1 << 10},
		{"long", "head -c 3000000 /dev/zero | tr '\\0' x; exit 1", "xxxx", 5 << 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := filepath.Join(t.TempDir(), "bad-agent")
			if err := os.WriteFile(bad, []byte("#!/bin/sh\n"+c.script+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			d := newDriverAgent(t, "runc", bad)
			defer d.Close()
			// The claim waits for the agent until its context ends: long
			// enough for the container's start on a loaded host.
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			defer cancel()
			_, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-badagent-" + c.name})
			if err == nil {
				t.Fatal("the claim of an agent that exits succeeded")
			}
			if msg := err.Error(); !strings.Contains(msg, c.want) || len(msg) > c.most {
				t.Errorf("the claim's error (%d bytes) should quote %q in at most %d bytes: %.300q", len(msg), c.want, c.most, msg)
			}
		})
	}
}
