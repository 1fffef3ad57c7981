package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const clkTck = 100 // USER_HZ on Linux: the unit of /proc CPU times

// CPUTime returns the user+system CPU time the process has used so far.
func (n *Node) CPUTime() (time.Duration, error) {
	pid := n.PID()
	if pid == 0 {
		return 0, fmt.Errorf("%s: not running", n.ID)
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the parenthesised command: state is field 3, utime 14, stime 15.
	i := bytes.LastIndexByte(data, ')')
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("%s: short /proc stat", n.ID)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clkTck, nil
}

// SelfCPUTime returns the CPU time this process has used so far.
func SelfCPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// MachineBusy returns the CPU time all processes on the machine have used
// so far (every non-idle field of /proc/stat's cpu line), to tell how much
// of the machine other work took during a measurement.
func MachineBusy() time.Duration {
	var busy int64
	// cpu user nice system idle iowait irq softirq steal guest guest_nice;
	// guest time is already counted in user.
	for i, n := range machineCPU() {
		if i == 3 || i == 4 || i >= 8 {
			continue
		}
		busy += n
	}
	return time.Duration(busy) * time.Second / clkTck
}

// MachineIOWait returns the time the machine's CPUs have spent idle with a
// disk request outstanding so far (/proc/stat's iowait): time the machine
// waited on its disk, which grows in a disk stall.
func MachineIOWait() time.Duration {
	f := machineCPU()
	if len(f) < 5 {
		return 0
	}
	return time.Duration(f[4]) * time.Second / clkTck
}

// machineCPU returns the fields of /proc/stat's cpu line, in clock ticks
// (nil if it cannot be read).
func machineCPU() []int64 {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) == 0 {
		return nil
	}
	out := make([]int64, len(f)-1)
	for i, v := range f[1:] {
		out[i], _ = strconv.ParseInt(v, 10, 64)
	}
	return out
}

// OwnCPUTime returns the CPU time used so far by this process and by every
// running server of the cluster.
func (c *Cluster) OwnCPUTime() time.Duration {
	t := SelfCPUTime()
	for _, n := range c.Nodes {
		if d, err := n.CPUTime(); err == nil {
			t += d
		}
	}
	return t
}

// WaitQuiet waits until the rest of the machine (everything but this
// process and the servers) keeps fewer than maxCores busy over a second,
// so that a measurement is not skewed by unrelated work such as builds.
// It gives up after timeout and reports whether the machine got quiet.
func (c *Cluster) WaitQuiet(ctx context.Context, maxCores float64, timeout time.Duration) (bool, float64) {
	deadline := time.Now().Add(timeout)
	other := 0.0
	for {
		m0, o0, t0 := MachineBusy(), c.OwnCPUTime(), time.Now()
		select {
		case <-ctx.Done():
			return false, other
		case <-time.After(time.Second):
		}
		m1, o1 := MachineBusy(), c.OwnCPUTime()
		other = max(0, ((m1-m0)-(o1-o0)).Seconds()/time.Since(t0).Seconds())
		if other < maxCores || time.Now().After(deadline) {
			return other < maxCores, other
		}
	}
}

// RSS returns the process's resident set size in bytes.
func (n *Node) RSS() (int64, error) {
	pid := n.PID()
	if pid == 0 {
		return 0, fmt.Errorf("%s: not running", n.ID)
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("%s: no VmRSS", n.ID)
}
