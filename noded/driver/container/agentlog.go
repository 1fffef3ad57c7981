package container

import (
	"fmt"
	"os"
	"path/filepath"
)

// The agent's stdout and stderr are the container's, and a command in the
// sandbox runs as root: it can write to them (`cat /dev/zero >
// /proc/1/fd/1`). The runc shim's file:// log appends everything to a file
// on the host (containerd's pkg/process opens it O_APPEND and copies the
// pipes into it), so that filled the node's disk. Instead the shim runs a
// logging binary (a binary:// log URI): a script the driver writes into its
// state directory, which keeps the first agentLogCap bytes in the box's
// agent.log, notes that the rest is dropped, and reads and drops it.
//
// The script is the shim's child, not the node's: it goes on draining while
// the node is down or restarting, so the agent is never held in a write to
// a pipe nobody reads (as with a FIFO read by the node), and the bound holds
// without the node. The head is kept, not the tail: the agent's start-up
// errors, which the driver quotes when the agent does not answer, are the
// first thing it writes.
const (
	agentLogCap    = 1 << 20
	agentLogWriter = "agent-log-writer" // the script, in the state directory
	agentLogName   = "agent.log"        // in each box's directory
)

// agentLogScript is run by the shim with the container's stdout on fd 3,
// its stderr on fd 4, and fd 5 to close once it is ready; the URI's one
// argument puts the log file in $2, which it opens (on fd 6) before it says
// it is ready, so the file is there before the container starts and is not
// opened by name again. The shim gives it no PATH.
//
// The bound is the file size limit (RLIMIT_FSIZE, in 512-byte blocks) of
// the cat that writes the file: its write past the limit fails with EFBIG
// (SIGXFSZ ignored) and it ends, and the note goes after it. cat writes
// what it reads at once, so a short message is in the file as soon as the
// agent wrote it (head -c would hold it in its stdio buffer until it ended).
var agentLogScript = fmt.Sprintf(`#!/bin/sh
# Written by warren's container driver: containerd's runc shim runs this as
# the logging binary of a container's agent. It keeps the first %[1]d bytes
# of the container's stdout (fd 3) and stderr (fd 4) in the file named by
# its second argument and drops the rest, still reading it, so that neither
# the host's disk fills nor the agent waits on a full pipe.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
exec 6>"$2" || exit 1
exec 5>&-
{ cat <&4 & exec cat <&3; } 6>&- | {
	if ! (trap '' XFSZ; ulimit -S -f %[2]d; exec cat >&6 2>/dev/null); then
		echo "[warren: the agent's output past %[1]d bytes is dropped]" >&6
	fi
	exec cat >/dev/null 6>&-
}
`, agentLogCap, agentLogCap/512)

// writeAgentLogWriter writes the script into the state directory and
// returns its absolute path (a log URI's path must be absolute).
func writeAgentLogWriter(stateDir string) (string, error) {
	p, err := filepath.Abs(filepath.Join(stateDir, agentLogWriter))
	if err != nil {
		return "", err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(agentLogScript), 0o755); err != nil {
		return "", fmt.Errorf("container: %s: %w", agentLogWriter, err)
	}
	return p, os.Rename(tmp, p)
}
