package microvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/noded/driver"
)

// vmSpec is one QEMU process. It is pure data; args renders the command
// line (tested without QEMU).
type vmSpec struct {
	ID        string // also in QEMU's -name as "warren-<ID>": the reaper's mark
	Dir       string // qmp.sock, agent.sock, console.log, disk.qcow2 live here
	Kernel    string
	Initramfs string
	Disk      string // the qcow2 overlay; "" boots without a root disk (probe)
	MemMB     int
	VCPUs     int
	// MemFile backs guest memory with a file: shared (a template being
	// snapshotted) or private copy-on-write (a clone of that snapshot).
	MemFile  string
	MemShare bool
	Accel    string // "kvm" or "tcg"
	Incoming bool   // wait for migrate-incoming (a restore)
	Cmdline  string // kernel command line (must match between snapshot and clone)
	CPU      string // -cpu under TCG, "" for QEMU's default (must match between snapshot and clone)
	NoTHP    bool   // start QEMU without transparent huge pages (startQEMU)
	// TBSizeMB is TCG's translation cache (0: DefaultTCGCacheMB).
	TBSizeMB int
	// NIC gives the VM a virtio-net device. Its backend is the tap passed
	// to start as fd 3 when Tap is set (a sandbox with the node's egress
	// policy), else a hub port with nothing on it: the device exists
	// either way, so a snapshot's clones match it whatever their network.
	NIC bool
	Tap bool `json:"-"`
	// AgentWire: the guest's agent is known to read the wire codec (a
	// clone of a snapshot whose agent said so), so the host's calls use
	// it from the first (guest.Client.UseWire); otherwise the first
	// ping's answer tells.
	AgentWire bool `json:",omitempty"`
}

// incomingURI is migrate-incoming's URI for the saved state start passed
// to QEMU as an open file (after the tap, if any): QEMU takes a numeric
// fd: name as an inherited descriptor, so no shell and cat stand between.
func (s vmSpec) incomingURI() string {
	fd := 3
	if s.Tap {
		fd++
	}
	return "fd:" + strconv.Itoa(fd)
}

// guestMAC is every guest's MAC: each sits alone on its own link.
const guestMAC = "52:54:00:77:00:02"

func (s vmSpec) tbSize() int {
	if s.TBSizeMB > 0 {
		return s.TBSizeMB
	}
	return DefaultTCGCacheMB
}

// DefaultTCGCacheMB is the size of TCG's translation cache per VM. QEMU's
// default for system emulation is 1 GiB (32 MiB before QEMU 5.0); the
// part a VM touches is resident and private to it.
const DefaultTCGCacheMB = 64

func (s vmSpec) qmpPath() string   { return filepath.Join(s.Dir, "qmp.sock") }
func (s vmSpec) agentPath() string { return filepath.Join(s.Dir, "agent.sock") }

func (s vmSpec) args() []string {
	machine := "microvm"
	accel := "tcg,tb-size=" + strconv.Itoa(s.tbSize())
	if s.Accel == "kvm" {
		accel = "kvm"
	}
	a := []string{
		"-name", "warren-" + s.ID,
		"-accel", accel,
		"-smp", strconv.Itoa(max(s.VCPUs, 1)),
		"-m", strconv.Itoa(s.MemMB),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-kernel", s.Kernel, "-initrd", s.Initramfs,
		"-append", s.Cmdline,
		// Appended to (append=on), so the reaper can truncate a console
		// the guest keeps writing to (maxConsoleBytes).
		"-chardev", "file,id=console,append=on,path=" + filepath.Join(s.Dir, "console.log"),
		"-serial", "chardev:console",
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,path=" + s.agentPath() + ",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=" + guest.PortName,
		"-qmp", "unix:" + s.qmpPath() + ",server=on,wait=off",
		"-sandbox", seccompArgs,
	}
	if s.Accel == "kvm" {
		a = append(a, "-cpu", "host")
	} else if s.CPU != "" {
		a = append(a, "-cpu", s.CPU)
	}
	if s.MemFile != "" {
		share := "off"
		if s.MemShare {
			share = "on"
		}
		a = append(a, "-object", fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=%s,share=%s", s.MemMB, s.MemFile, share))
		machine += ",memory-backend=mem"
	}
	a = append([]string{"-M", machine}, a...)
	if s.Disk != "" {
		a = append(a, "-drive", "id=root,file="+s.Disk+",format=qcow2,if=none,discard=unmap",
			"-device", "virtio-blk-device,drive=root")
	}
	if s.NIC {
		backend := "hubport,id=net0,hubid=0"
		if s.Tap {
			backend = "tap,id=net0,fd=3"
		}
		a = append(a, "-netdev", backend, "-device", "virtio-net-device,netdev=net0,mac="+guestMAC)
	}
	if s.Incoming {
		// No self-announce after the state is loaded: QEMU would make the
		// guest send gratuitous ARP and neighbour advertisements for the
		// address it had when the state was saved, five times over half a
		// second, while a claim waits for the guest. A clone gets its
		// address at its claim; a resumed sandbox keeps its own, on the
		// same node, behind its own tap.
		a = append(a, "-incoming", "defer", "-global", "migration.announce-rounds=0")
	}
	return a
}

// seccompArgs is QEMU's own system call filter (-sandbox), as libvirt sets
// it: QEMU emulates the untrusted guest's devices as root, so a QEMU the
// guest took over must not start a process (fork, exec: a shell), enter
// namespaces, change its ids, or make obsolete or host-wide calls (mount,
// reboot, kexec, …): the kernel kills QEMU for each (SIGSYS). Changing
// its scheduling is refused (EPERM). It still opens
// the files on its command line at its start; a snapshot's state goes to a
// file the node opens and hands over (saveState).
const seccompArgs = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// kernelCmdline is the guest's command line. tsc_early_khz avoids a hang
// in TSC calibration under TCG.
func kernelCmdline(extra string) string {
	c := "console=ttyS0 quiet panic=-1 reboot=t"
	if khz := hostTSCkHz(); khz > 0 {
		c += " tsc_early_khz=" + strconv.Itoa(khz)
	}
	if extra != "" {
		c += " " + extra
	}
	return c
}

// hostTSCkHz is the host's TSC frequency (a guest's under TCG, whose
// RDTSC reads the host's), found once per process (0 if unknown).
func hostTSCkHz() int {
	tscOnce.Do(func() { tscKHz = findTSCkHz() })
	return tscKHz
}

var (
	tscOnce sync.Once
	tscKHz  int
)

// findTSCkHz reads the TSC's frequency where the kernel says it, and
// measures it elsewhere. /proc/cpuinfo's "cpu MHz" is the kernel's TSC
// (or CPU) calibration only where it cannot read the CPU's actual clock
// (a VM, a CPU without APERF/MPERF); on a bare-metal host that can, it is
// the clock of the moment, which frequency scaling moves, and was taken
// for the TSC's: guests got a wrong tsc_early_khz, and a snapshot's
// identity (its command line) changed from one node start to the next.
func findTSCkHz() int {
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/tsc_freq_khz"); err == nil {
		if k, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && k > 0 {
			return k
		}
	}
	flags := strings.Fields(cpuinfo("flags"))
	if slices.Contains(flags, "hypervisor") || !slices.Contains(flags, "aperfmperf") {
		if f, err := strconv.ParseFloat(cpuinfo("cpu MHz"), 64); err == nil && f > 0 {
			return int(f * 1000)
		}
	}
	return measureTSCkHz()
}

// measureTSCkHz times the TSC against the raw monotonic clock (the
// median of five 30 ms spans), rounded to a MHz so that it is the same
// from one start to the next; 0 where there is no TSC to read. The raw
// clock, because NTP slews the other (up to 8%, chrony's default bound,
// while it corrects a clock at boot).
func measureTSCkHz() int {
	raw := func() int64 {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_RAW, &ts); err != nil {
			return 0
		}
		return ts.Nano()
	}
	var khz []float64
	for range 5 {
		t0, c0 := raw(), rdtsc()
		time.Sleep(30 * time.Millisecond)
		c1, t1 := rdtsc(), raw()
		if c1 <= c0 || t0 == 0 || t1 <= t0 {
			return 0
		}
		khz = append(khz, float64(c1-c0)/(float64(t1-t0)/1e9)/1000)
	}
	slices.Sort(khz)
	return int(math.Round(khz[len(khz)/2]/1000)) * 1000
}

// cpuinfo returns the first value of key in /proc/cpuinfo ("" if none).
func cpuinfo(key string) string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// proc is a running QEMU.
type proc struct {
	pid    int
	exited chan struct{} // closed when the process is gone
}

// start launches QEMU in its own session (it outlives a node restart, to be
// re-adopted) and, when procsFiles are given, inside those cgroups before
// QEMU's first instruction: a shell joins them and execs QEMU. state, if
// set, is a saved state for an Incoming spec, passed open (incomingURI).
func start(qemu string, s vmSpec, procsFiles []string, tap *os.File, state string) (*proc, error) {
	if s.Tap != (tap != nil) {
		return nil, errors.New("start qemu: a tap backend needs its file")
	}
	if len(s.qmpPath()) > 107 || len(s.agentPath()) > 107 {
		return nil, fmt.Errorf("state dir too deep: %s is over the 107 bytes a unix socket path may have", s.agentPath())
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(s.Dir, "qemu.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	script := `for f in $WARREN_CGROUP_PROCS; do echo $$ > "$f" || exit 97; done; exec "$0" "$@"`
	cmd := exec.Command("/bin/sh", append([]string{"-c", script, qemu}, s.args()...)...)
	cmd.Env = append(qemuEnv(os.Environ()), "WARREN_CGROUP_PROCS="+strings.Join(procsFiles, " "))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if tap != nil {
		cmd.ExtraFiles = []*os.File{tap} // fd 3
	}
	if state != "" {
		f, err := os.Open(state)
		if err != nil {
			return nil, fmt.Errorf("start qemu: saved state: %w", err)
		}
		defer f.Close()                            // QEMU holds its own copy
		cmd.ExtraFiles = append(cmd.ExtraFiles, f) // s.incomingURI()
	}
	if err := startQEMU(cmd, s.NoTHP); err != nil {
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	p := &proc{pid: cmd.Process.Pid, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	if err := os.WriteFile(filepath.Join(s.Dir, "pid"), []byte(strconv.Itoa(p.pid)), 0o644); err != nil {
		p.kill()
		return nil, err
	}
	return p, nil
}

// thpMu serializes QEMU starts: the transparent-huge-page flag belongs to
// the whole process, and a child takes it at execve.
var thpMu sync.Mutex

// startQEMU starts cmd, with transparent huge pages off if noTHP
// (PR_SET_THP_DISABLE is inherited across fork and kept across execve, so
// the shell and the QEMU it execs both run with it). The node's own flag
// is set back once the child has exec'd. If the flag cannot be set, QEMU
// starts with huge pages: only memory is at stake.
func startQEMU(cmd *exec.Cmd, noTHP bool) error {
	thpMu.Lock()
	defer thpMu.Unlock()
	if !noTHP {
		return cmd.Start()
	}
	if was, err := unix.PrctlRetInt(unix.PR_GET_THP_DISABLE, 0, 0, 0, 0); err != nil || was != 0 {
		return cmd.Start() // cannot tell, or off already
	}
	if err := unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0); err != nil {
		return cmd.Start()
	}
	defer unix.Prctl(unix.PR_SET_THP_DISABLE, 0, 0, 0, 0)
	return cmd.Start()
}

// adopt watches a QEMU this process did not start (after a node restart).
func adopt(pid int) *proc {
	p := &proc{pid: pid, exited: make(chan struct{})}
	go func() {
		for {
			if syscall.Kill(pid, 0) != nil {
				close(p.exited)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return p
}

// kill ends QEMU and waits (bounded) until it is gone.
func (p *proc) kill() {
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
	}
}

// isOurQEMU reports whether pid runs QEMU with -name warren-<id>.
func isOurQEMU(pid int, id string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(b, []byte("\x00-name\x00warren-"+id+"\x00"))
}

// qemusNamed returns every process with -name warren-<id> (ourQEMUs keeps
// one pid per id, so it would hide a second). A VM's pid file can miss
// one: a node that dies between a QEMU's start and the file's write
// leaves the file naming the one before, or none.
func qemusNamed(id string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if isOurQEMU(pid, id) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// ourQEMUs returns the pid of every QEMU on the host named warren-<id>.
func ourQEMUs() map[string]int {
	out := map[string]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := bytes.Split(b, []byte{0})
		for i := 0; i+1 < len(args); i++ {
			if string(args[i]) == "-name" && bytes.HasPrefix(args[i+1], []byte("warren-")) {
				out[string(args[i+1][len("warren-"):])] = pid
			}
		}
	}
	return out
}

// qemuVersion returns "7.2.x" from `qemu -version`.
func qemuVersion(qemu string) (string, error) {
	out, err := exec.Command(qemu, "-version").Output()
	if err != nil {
		return "", fmt.Errorf("%s -version: %w", qemu, err)
	}
	f := strings.Fields(string(out))
	for i, w := range f {
		if w == "version" && i+1 < len(f) {
			return f[i+1], nil
		}
	}
	return "", errors.New("qemu version: unrecognised output")
}

// How long waitAgent's first ping waits for an answer: a booting guest's
// agent answers once the guest is up (seconds under TCG), a restored one's
// within a fraction of a second; a running guest's (re-adoption, a resumed
// sandbox's fresh session) within a few, however busy the host.
const (
	bootAgentWait      = 10 * time.Second
	resumeAgentWait    = time.Second
	reconnectAgentWait = 2 * time.Second
)

// waitAgent connects to the guest agent and waits until it answers.
//
// A ping that gets no answer within wait is retried on a new connection,
// after a pause in which the guest sees the hang-up and ends its session;
// each attempt waits twice as long as the one before, so a slow guest still
// gets its time. The session itself failing is retried at once. A ping can
// go unanswered for good in two ways:
//   - An agent that closes its port between hosts (templates made before
//     the agent held its port open) can lose a host's first calls when the
//     host connects just as the agent closes the port (docs/sandboxes.md,
//     "The agent's port").
//   - In QEMU 7.2 a guest's write that meets the host's hang-up (the last
//     host hung up in the middle of a call, or just as one ended) can leave
//     the virtio-serial port throttled: the socket chardev disconnects
//     inside the failed write, and the port then throttles itself with no
//     watch left to lift it. A new connection does not lift it either: the
//     guest gets the new host's calls, but its answers stay in the VM. A
//     hang-up does, and QEMU drops what the guest wrote.
func waitAgent(ctx context.Context, s vmSpec, exited <-chan struct{}, wait time.Duration, log *slog.Logger) (*guest.Client, error) {
	ctx, cancel := whileRunning(ctx, exited)
	defer cancel()
	gone := func() error {
		select {
		case <-exited:
			return fmt.Errorf("qemu exited: %s", tail(filepath.Join(s.Dir, "qemu.log"), filepath.Join(s.Dir, "console.log")))
		default:
			return nil
		}
	}
	for attempt := 1; ; {
		if err := gone(); err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("agent: %w: %s", err, tail(filepath.Join(s.Dir, "console.log")))
		}
		c, err := guest.Dial(ctx, s.agentPath())
		if err != nil {
			time.Sleep(2 * time.Millisecond)
			continue
		}
		if s.AgentWire {
			c.UseWire()
		}
		// The ping waits in the socket until the agent opens its port.
		pctx, pcancel := context.WithTimeout(ctx, wait)
		_, err = c.Ping(pctx)
		timedOut := pctx.Err() != nil && ctx.Err() == nil
		pcancel()
		if err == nil {
			return c, nil
		}
		c.Close()
		if err := gone(); err != nil {
			return nil, err
		}
		if !timedOut {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		log.Info("the guest agent did not answer; reconnecting", "vm", s.ID, "attempt", attempt, "waited", wait)
		time.Sleep(time.Duration(attempt) * 50 * time.Millisecond)
		attempt++
		wait *= 2
	}
}

// whileRunning returns a context that also ends when QEMU exits (exited
// is closed), so a wait on QEMU does not outlast it.
func whileRunning(ctx context.Context, exited <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// tail returns the end of each file, for an error message. It reads the
// last 4 KiB only: the guest writes the console, as much as it likes.
func tail(files ...string) string {
	var parts []string
	for _, f := range files {
		b := driver.ReadEnd(f, 4<<10)
		s := strings.TrimSpace(string(b))
		if len(s) > 600 {
			s = "…" + s[len(s)-600:]
		}
		if s != "" {
			parts = append(parts, filepath.Base(f)+": "+s)
		}
	}
	if len(parts) == 0 {
		return "no output"
	}
	return strings.Join(parts, "; ")
}

// QEMUVersion returns the version QEMU reports.
func QEMUVersion(qemu string) (string, error) { return qemuVersion(qemu) }

// qemuEnv is the part of the node's environment QEMU gets: not the
// node's credentials (WARREN_FORGE_TOKEN, model API keys), which a QEMU
// process has no use for and which its /proc/PID/environ would show.
func qemuEnv(environ []string) []string {
	var env []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "PATH", k == "HOME", k == "TMPDIR", k == "TZ", k == "LANG", strings.HasPrefix(k, "LC_"):
			env = append(env, kv)
		}
	}
	return env
}
