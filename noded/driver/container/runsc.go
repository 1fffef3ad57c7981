package container

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/warrenhq/warren/noded/driver"
)

// gVisor (runsc) runs through containerd's runc shim, which runs an OCI
// runtime binary with runc's command line. Debian's runsc ships no shim of
// its own, so the driver writes a wrapper that runs runsc with the flags a
// warren sandbox needs:
//
//   - --network=none: runsc does not make a network namespace of its own
//     and refuses to run its network stack in the host's; without the
//     egress policy a sandbox has only loopback, which is what none gives
//     (the runc containers' fresh namespace holds only loopback too).
//   - --host-uds=create: the agent listens on a unix socket in the
//     bind-mounted /run/warren; gVisor keeps sockets inside the sandbox
//     unless it may create them on the host. "create" lets the sandbox
//     make sockets but not connect to the host's.
const runscFlags = "--network=none --host-uds=create"

// runscWrapper is the wrapper's name in the driver's state directory.
const runscWrapper = "runsc-wrapper"

func writeRunscWrapper(stateDir string) (string, error) {
	bin, err := exec.LookPath("runsc")
	if err != nil {
		return "", fmt.Errorf("container: runtime runsc: %w (apt-get install runsc)", err)
	}
	bin, _ = filepath.Abs(bin)
	p := filepath.Join(stateDir, runscWrapper)
	script := fmt.Sprintf("#!/bin/sh\n# Written by warren's container driver: the runc shim runs this as its OCI runtime.\nexec %s %s \"$@\"\n", driver.ShellQuote(bin), runscFlags)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(script), 0o755); err != nil {
		return "", err
	}
	return p, os.Rename(tmp, p)
}

// runscForceDelete deletes a container through runsc itself, with the root
// the runc shim gives it (/run/containerd/runc/NAMESPACE).
func (d *Driver) runscForceDelete(ctx context.Context, id string) {
	root := filepath.Join("/run/containerd/runc", d.cfg.Namespace)
	out, err := exec.CommandContext(ctx, d.cfg.RuncBinary, "--root", root, "delete", "--force", id).CombinedOutput()
	if err != nil {
		d.log.Warn("runsc delete --force", "container", id, "err", err, "output", strings.TrimSpace(string(out)))
	}
}

// hostPids is the pids.max of the container's host cgroup. Under runc it
// is the sandbox's process limit. Under runsc the host cgroup holds
// gVisor's own processes and threads (the ptrace platform keeps a host
// thread per guest thread, plus its stubs), and a sentry that cannot make a
// thread dies with the whole sandbox: there it is a loose outer bound, and
// the agent sets the sandbox's limit inside, as RLIMIT_NPROC, which gVisor
// enforces.
func (d *Driver) hostPids(pids int) int64 {
	if d.cfg.Runtime != "runsc" {
		return int64(pids)
	}
	return int64(32*pids + 4096)
}
