package guest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// LinuxSystem is the System of a Linux guest.
type LinuxSystem struct {
	// cgroupFD, if >= 0, is an open cgroup v2 directory every exec'd
	// command is started in: its pids.max and memory.max bound the
	// sandbox's workload, not the agent.
	cgroupFD int
	cgroup   string
	// killFD is the cgroup's cgroup.kill, opened with it (-1 on a kernel
	// without one), so that killing the strays after a command is one
	// write.
	killFD int
	// eventsFD is the cgroup's cgroup.events, opened with it (-1 if it
	// could not be): KillStrays reads it after each kill, one pread.
	eventsFD int
	// urandom is /dev/urandom, opened once (-1 until it could be): a
	// claim's reseed then makes no open and close, which a clone's claim
	// would run for the first time (under TCG, translated afresh) before
	// its first command.
	urandomMu sync.Mutex
	urandom   int
	// Container is set when the agent runs in a container: it shares the
	// host's kernel, so the clock, entropy pool and hostname are the
	// host's (or the runtime's) and are left alone.
	Container bool
	// UnderInit is set when the agent's parent is its container's init
	// (Supervise), in a pid namespace of the container's own.
	UnderInit bool
}

// NewLinuxSystem opens execCgroup ("" for none) once for all commands.
func NewLinuxSystem(execCgroup string) (*LinuxSystem, error) {
	s := &LinuxSystem{cgroupFD: -1, killFD: -1, eventsFD: -1, cgroup: execCgroup, urandom: -1}
	if fd, err := unix.Open("/dev/urandom", unix.O_WRONLY|unix.O_CLOEXEC, 0); err == nil {
		s.urandom = fd // else AddEntropy tries again
	}
	if execCgroup != "" {
		fd, err := unix.Open(execCgroup, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("exec cgroup %s: %w", execCgroup, err)
		}
		s.cgroupFD = fd
		if fd, err := unix.Openat(fd, "cgroup.kill", unix.O_WRONLY|unix.O_CLOEXEC, 0); err == nil {
			s.killFD = fd
		}
		if fd, err := unix.Openat(fd, "cgroup.events", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			s.eventsFD = fd
		}
	}
	return s, nil
}

// SetTime sets CLOCK_REALTIME (not in a container: its clock is the host's).
func (s *LinuxSystem) SetTime(unixNano int64) error {
	if s.Container {
		return nil
	}
	ts := unix.NsecToTimespec(unixNano)
	return unix.ClockSettime(unix.CLOCK_REALTIME, &ts)
}

// AddEntropy mixes seed into the kernel's pool, credits it, and forces the
// CRNG to reseed, so a clone's random stream departs from its snapshot's.
func (s *LinuxSystem) AddEntropy(seed []byte) error {
	if s.Container {
		return nil // the host kernel's pool, not a copy of a snapshot's
	}
	s.urandomMu.Lock()
	defer s.urandomMu.Unlock()
	if s.urandom < 0 {
		fd, err := unix.Open("/dev/urandom", unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		s.urandom = fd
	}
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	buf := make([]byte, 8+len(seed))
	*(*int32)(unsafe.Pointer(&buf[0])) = int32(len(seed) * 8)
	*(*int32)(unsafe.Pointer(&buf[4])) = int32(len(seed))
	copy(buf[8:], seed)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(s.urandom), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return fmt.Errorf("RNDADDENTROPY: %w", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(s.urandom), unix.RNDRESEEDCRNG, 0); e != 0 {
		return fmt.Errorf("RNDRESEEDCRNG: %w", e)
	}
	return nil
}

// SetPids writes the commands' cgroup's pids.max. In a container without
// one (gVisor: the host's pids cgroup bounds gVisor's own threads, not the
// sandbox's processes) it sets RLIMIT_NPROC on the agent, which every
// command inherits and which gVisor enforces for root too.
func (s *LinuxSystem) SetPids(n int) error {
	if s.cgroupFD < 0 {
		if !s.Container {
			return nil
		}
		return unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: uint64(n), Max: uint64(n)})
	}
	return os.WriteFile(filepath.Join(s.cgroup, "pids.max"), []byte(strconv.Itoa(n)), 0o644)
}

// SetHostname sets the UTS hostname.
func (s *LinuxSystem) SetHostname(name string) error {
	if s.Container {
		return nil // the runtime set it when it made the container
	}
	return unix.Sethostname([]byte(name))
}

// ExecAttr puts the command in its own process group and, when the exec
// cgroup exists, in that cgroup from its first instruction.
func (s *LinuxSystem) ExecAttr() *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setpgid: true}
	if s.cgroupFD >= 0 {
		attr.UseCgroupFD = true
		attr.CgroupFD = s.cgroupFD
	}
	return attr
}

// KillStrays kills every process in the commands' cgroup at once
// (cgroup.kill, which also catches one forking meanwhile; on a kernel
// before 5.14, each pid in cgroup.procs). In a container without that
// cgroup, where the agent is the child of its pid namespace's init (this
// program's Supervise, which says so: UnderInit), every other process
// there is a command's, and kill(-1) reaches all of them but not the agent
// or init. Otherwise (an agent run on a host, as in tests) it cannot tell
// a command's stray from anything else, and does nothing.
//
// A signal is delivered when its target next runs, so KillStrays then
// waits, up to StrayWait, until none of them runs any more: the next
// command, which waits for it, never sees one alive. A dead one may stay a
// zombie until init reaps it.
func (s *LinuxSystem) KillStrays() error {
	if s.cgroupFD < 0 {
		if !s.Container || !s.UnderInit || os.Getppid() != 1 {
			return nil
		}
		if err := unix.Kill(-1, unix.SIGKILL); err != nil && err != unix.ESRCH {
			return fmt.Errorf("kill(-1): %w", err)
		}
		return waitStrays(othersAlive)
	}
	if s.killFD >= 0 {
		if _, err := unix.Write(s.killFD, []byte("1")); err != nil {
			return fmt.Errorf("%s/cgroup.kill: %w", s.cgroup, err)
		}
		return waitStrays(s.cgroupAlive)
	}
	b, err := os.ReadFile(filepath.Join(s.cgroup, "cgroup.procs"))
	if err != nil {
		return err
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
	return waitStrays(s.cgroupAlive)
}

// StrayWait bounds KillStrays' wait for the killed to end: one in an
// uninterruptible sleep (a write to a slow disk) ends only when that does.
var StrayWait = 2 * time.Second

// waitStrays polls alive, which counts the strays still running, until it
// is 0 or StrayWait has passed.
func waitStrays(alive func() (int, error)) error {
	deadline := time.Now().Add(StrayWait)
	for pause := 100 * time.Microsecond; ; pause = min(2*pause, 10*time.Millisecond) {
		n, err := alive()
		if err != nil || n == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d killed processes still run after %v", n, StrayWait)
		}
		time.Sleep(pause)
	}
}

// cgroupAlive reads the commands' cgroup's populated flag, which counts
// live processes only (not zombies): 1 or 0.
func (s *LinuxSystem) cgroupAlive() (int, error) {
	if s.eventsFD < 0 {
		return 0, fmt.Errorf("%s/cgroup.events: could not be opened", s.cgroup)
	}
	b := make([]byte, 256)
	n, err := unix.Pread(s.eventsFD, b, 0) // kernfs makes the file afresh at offset 0
	if err != nil {
		return 0, fmt.Errorf("%s/cgroup.events: %w", s.cgroup, err)
	}
	for _, line := range strings.Split(string(b[:n]), "\n") {
		if v, ok := strings.CutPrefix(line, "populated "); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("%s/cgroup.events: no populated line", s.cgroup)
}

// othersAlive counts the processes of the pid namespace, other than init
// and this one, that are not zombies.
func othersAlive() (int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	self := os.Getpid()
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 1 || pid == self {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil && !isZombie(st) {
			n++
		}
	}
	return n, nil
}

// isZombie reads the state of a /proc/PID/stat (after the command's name,
// which may hold spaces and parentheses).
func isZombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X')
}

// Stats reads /proc and statfs.
func (*LinuxSystem) Stats() (Stats, error) {
	var st Stats
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 2 {
				continue
			}
			v, _ := strconv.ParseInt(fs[1], 10, 64)
			switch fs[0] {
			case "MemTotal:":
				st.MemTotalKB = v
			case "MemAvailable:":
				st.MemAvailableKB = v
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if fs := strings.Fields(string(b)); len(fs) > 0 {
			st.Load1, _ = strconv.ParseFloat(fs[0], 64)
		}
	}
	if b, err := os.ReadFile("/proc/uptime"); err == nil {
		if fs := strings.Fields(string(b)); len(fs) > 0 {
			f, _ := strconv.ParseFloat(fs[0], 64)
			st.UptimeMS = int64(f * 1000)
		}
	}
	if m, err := filepath.Glob("/proc/[0-9]*"); err == nil {
		st.Procs = len(m)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs("/", &sfs); err == nil {
		st.DiskTotalKB = int64(sfs.Blocks) * sfs.Bsize / 1024
		st.DiskFreeKB = int64(sfs.Bavail) * sfs.Bsize / 1024
	}
	return st, nil
}
