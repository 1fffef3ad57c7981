package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// An image build interrupted while a step runs says it was interrupted.
// Before, the step's own failure came out ("signal: killed" from the
// debootstrap that the interrupt ended), as if the build had broken.
// The debootstrap here is a FAKE that waits, found first on PATH.
func TestImageBuildInterruptedSaysSo(t *testing.T) {
	kernels, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(kernels) == 0 {
		t.Skip("needs a kernel in /boot (linux-image-amd64)")
	}
	for _, tool := range []string{"mkfs.ext4", "xz"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (e2fsprogs, xz-utils)", tool)
		}
	}
	fake := t.TempDir()
	started := filepath.Join(fake, "started")
	script := "#!/bin/sh\ntouch " + started + "\nexec sleep 60\n"
	if err := os.WriteFile(filepath.Join(fake, "debootstrap"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(warrenBin, "image", "build", "--dir", t.TempDir(), "--no-smoke", "--agent", warrenBin)
	cmd.Env = append(os.Environ(), "PATH="+fake+":"+os.Getenv("PATH"))
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := os.Stat(started); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the build never reached debootstrap:\n%s", errb.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGINT)
	cmd.Wait()
	if cmd.ProcessState.ExitCode() == 0 || !strings.Contains(errb.String(), "image build: interrupted") {
		t.Errorf("exit status %d, stderr:\n%s\nwant a failure saying the build was interrupted", cmd.ProcessState.ExitCode(), errb.String())
	}
}
