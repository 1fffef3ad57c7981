package noded

import (
	"runtime"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded/driver"
)

// sandboxLimits are the limits a task's sandboxes (its own and its
// verification sandboxes) are claimed with: the spec's resources, CPU
// rounded up to whole vCPUs and at most hostCPUs (a node whose capacity
// was set above its cores still runs the task, on all of them), memory
// rounded up to whole MiB. A field left zero leaves the driver's default,
// which a warm claim gives; any other value makes the microvm driver boot
// the sandbox cold (docs/sandboxes.md, "Limits").
func sandboxLimits(r *warrenv1.Resources, hostCPUs int) driver.Limits {
	var l driver.Limits
	if m := r.GetMilliCpu(); m > 0 {
		l.VCPUs = int(min((m+999)/1000, int64(max(hostCPUs, 1))))
	}
	if b := r.GetMemoryBytes(); b > 0 {
		l.MemMB = int(b >> 20)
		if b&(1<<20-1) != 0 {
			l.MemMB++
		}
	}
	return l
}

// taskLimits are sandboxLimits of this host's CPUs.
func taskLimits(spec *warrenv1.TaskSpec) driver.Limits {
	return sandboxLimits(spec.GetResources(), runtime.NumCPU())
}
