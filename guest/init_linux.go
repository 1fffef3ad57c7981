package guest

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Kernel command-line parameters warren-guest reads as PID 1:
//
//	warren.probe=1      print ProbeMarker on the console and power off
//	warren.root=DEV     the root block device (default /dev/vda)
//	warren.pids=N       pids.max of the commands' cgroup (default 4096)
//	warren.reserve_mb=N memory kept from the commands for the agent (default 32)
const (
	// ProbeMarker is printed on the console by a probe boot: the host reads
	// it to tell that an accelerator really runs the guest.
	ProbeMarker = "warren-guest: probe ok"
	// ReadyMarker is printed on the console when the agent serves.
	ReadyMarker = "warren-guest: ready"
	// ModuleList is the initramfs file naming the kernel modules to load,
	// one path per line, dependencies first.
	ModuleList = "/etc/warren/modules"
	// PortName is the virtio-serial port the agent serves on.
	PortName = "agent"
	// ExecCgroup is the cgroup v2 directory of the commands.
	ExecCgroup = "/sys/fs/cgroup/sandbox"
)

// InitConfig is what PID 1 reads from the kernel command line.
type InitConfig struct {
	Probe     bool
	Root      string
	Pids      int
	ReserveMB int
}

// ParseCmdline reads warren.* parameters from a kernel command line.
func ParseCmdline(cmdline string) (InitConfig, error) {
	c := InitConfig{Root: "/dev/vda", Pids: 4096, ReserveMB: 32}
	for _, f := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(f, "=")
		var err error
		switch k {
		case "warren.probe":
			c.Probe = v == "1"
		case "warren.root":
			c.Root = v
		case "warren.pids":
			c.Pids, err = strconv.Atoi(v)
		case "warren.reserve_mb":
			c.ReserveMB, err = strconv.Atoi(v)
		}
		if err != nil {
			return c, fmt.Errorf("%s: %w", k, err)
		}
	}
	return c, nil
}

func console(msg string) {
	if f, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
		fmt.Fprintln(f, msg)
		f.Close()
	} else {
		fmt.Fprintln(os.Stderr, msg)
	}
}

// RunInit is warren-guest as PID 1: it mounts the pseudo filesystems, loads
// the listed kernel modules, switches to the root disk, sets up the
// commands' cgroup, then runs the agent as its child (restarting it if it
// dies) and reaps every orphan. It never returns unless setup fails.
func RunInit() error {
	for _, m := range []struct{ src, dst, fs string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
	} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fs, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	b, _ := os.ReadFile("/proc/cmdline")
	cfg, err := ParseCmdline(string(b))
	if err != nil {
		return err
	}
	if err := loadModules(ModuleList); err != nil {
		return err
	}
	if cfg.Probe {
		console(ProbeMarker)
		unix.Sync()
		return unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	}
	if err := switchRoot(cfg.Root); err != nil {
		return err
	}
	_ = os.MkdirAll("/dev/pts", 0o755)
	_ = unix.Mount("devpts", "/dev/pts", "devpts", 0, "")
	_ = os.MkdirAll("/run", 0o755)
	_ = unix.Mount("tmpfs", "/run", "tmpfs", 0, "mode=755")
	_ = unix.Sethostname([]byte("sandbox"))
	if err := setupCgroup(cfg); err != nil {
		console("warren-guest: cgroup: " + err.Error())
	}
	superviseAgent()
	return nil
}

func loadModules(list string) error {
	b, err := os.ReadFile(list)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, p := range strings.Fields(string(b)) {
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("module %s: %w", p, err)
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", p, err)
		}
	}
	return nil
}

// switchRoot mounts dev on /newroot and makes it / (as switch_root does,
// without freeing the initramfs: the agent runs from it).
func switchRoot(dev string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(dev); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("root device %s: not present after 30s", dev)
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = os.MkdirAll("/newroot", 0o755)
	if err := unix.Mount(dev, "/newroot", "ext4", unix.MS_NOATIME, ""); err != nil {
		return fmt.Errorf("mount root %s: %w", dev, err)
	}
	for _, d := range []string{"/proc", "/sys", "/dev"} {
		_ = os.MkdirAll("/newroot"+d, 0o755)
		if err := unix.Mount(d, "/newroot"+d, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s: %w", d, err)
		}
	}
	if err := unix.Chdir("/newroot"); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}

// setupCgroup creates the commands' cgroup: every exec runs in it, so a
// fork bomb or a memory hog hits its limits and not the agent.
func setupCgroup(cfg InitConfig) error {
	_ = os.MkdirAll("/sys/fs/cgroup", 0o755)
	if err := unix.Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
		return err
	}
	if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+pids +memory"), 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(ExecCgroup, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(ExecCgroup, "pids.max"), []byte(strconv.Itoa(cfg.Pids)), 0o644); err != nil {
		return err
	}
	// The commands may use what the booted guest has available, less a
	// reserve for the agent and the kernel: a hog then meets the cgroup's
	// OOM killer, never the guest-wide one.
	avail, err := memAvailable()
	if err != nil {
		return err
	}
	limit := avail - int64(cfg.ReserveMB)<<20
	if limit < 16<<20 {
		limit = 16 << 20
	}
	if err := os.WriteFile(filepath.Join(ExecCgroup, "memory.max"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		return err
	}
	// The whole group is killed on OOM, so a hog does not leave halves.
	_ = os.WriteFile(filepath.Join(ExecCgroup, "memory.oom.group"), []byte("1"), 0o644)
	return nil
}

// superviseAgent runs "warren-guest agent" as a child and reaps every
// process that ends up with PID 1 as its parent.
func superviseAgent() { Supervise([]string{"agent"}) }

// Supervise is PID 1's loop: it runs "warren-guest ARGS..." as a child,
// restarts it if it dies, and reaps every orphan (a container's init runs
// it for "serve").
func Supervise(args []string) {
	for {
		cmd := exec.Command("/proc/self/exe", args...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			console("warren-guest: start agent: " + err.Error())
			time.Sleep(time.Second)
			continue
		}
		agent := cmd.Process.Pid
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, 0, nil)
			if err != nil && !errors.Is(err, unix.EINTR) {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			if pid == agent {
				console(fmt.Sprintf("warren-guest: agent exited (%v); restarting", ws))
				time.Sleep(100 * time.Millisecond)
				break
			}
		}
	}
}

// memAvailable reads MemAvailable from /proc/meminfo, in bytes.
func memAvailable() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("MemAvailable: not in /proc/meminfo")
}

// FindPort returns the device of the virtio-serial port named name.
func FindPort(name string) (string, error) {
	ms, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
	for _, m := range ms {
		b, err := os.ReadFile(m)
		if err == nil && strings.TrimSpace(string(b)) == name {
			return "/dev/" + filepath.Base(filepath.Dir(m)), nil
		}
	}
	return "", fmt.Errorf("virtio-serial port %q: not found", name)
}

// RunAgent serves calls on the virtio-serial port forever. Each host
// connection is one yamux session; when the host goes away the port reads
// end of file, and the agent waits for the next connection on the port it
// holds open (see hostPort).
func RunAgent(logger *slog.Logger) error {
	// No oom_score_adj here: children would inherit it, and a hog that
	// cannot be killed panics the guest. The commands' cgroup keeps them
	// below what the guest has.
	cg := ExecCgroup
	if _, err := os.Stat(cg); err != nil {
		cg = ""
	}
	sys, err := NewLinuxSystem(cg)
	if err != nil {
		return err
	}
	srv := &Server{Sys: sys, Logger: logger}
	var dev string
	for i := 0; ; i++ {
		if dev, err = FindPort(PortName); err == nil {
			break
		}
		if i > 3000 {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
	var port *hostPort
	for port, err = openPort(dev); err != nil; port, err = openPort(dev) {
		time.Sleep(10 * time.Millisecond)
	}
	console(ReadyMarker)
	port.serve(srv)
	return nil
}
