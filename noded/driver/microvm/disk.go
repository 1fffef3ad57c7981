package microvm

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// createOverlay makes a qcow2 file whose reads fall through to backing
// (copy-on-write): a sandbox's root disk costs only what it writes.
func createOverlay(ctx context.Context, backing, backingFmt, path string) error {
	out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2",
		"-o", "backing_file="+backing+",backing_fmt="+backingFmt, path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img create %s: %w: %s", path, err, strings.TrimSpace(string(out)))
	}
	return nil
}
