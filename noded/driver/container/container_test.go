package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/internal/testenv"
	"github.com/warrenhq/warren/noded/driver"
)

// These tests run real containers: they need root, a running containerd
// (its socket at $WARREN_CONTAINERD or DefaultSocket), runc and the default
// template (`make image`); without them they skip and say why. .ci/run
// starts containerd.

// agentBin is warren-guest built from this tree by TestMain.
var agentBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "warren-agent-")
	if err != nil {
		panic(err)
	}
	agentBin = filepath.Join(dir, "warren-guest")
	cmd := exec.Command("go", "build", "-o", agentBin, "github.com/warrenhq/warren/cmd/warren-guest")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		panic(fmt.Sprintf("build warren-guest: %v\n%s", err, out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func imageDir() string {
	if d := os.Getenv("WARREN_IMAGE_DIR"); d != "" {
		return d
	}
	return "/var/lib/warren/templates"
}

func newDriver(t *testing.T) *Driver { return newDriverWith(t, "runc") }

// newDriverWith makes a driver on the given runtime, runc or runsc.
func newDriverWith(t *testing.T, runtime string) *Driver {
	t.Helper()
	return newDriverAgent(t, runtime, agentBin)
}

// newDriverAgent makes a driver whose containers run agent as their init.
func newDriverAgent(t *testing.T, runtime, agent string) *Driver {
	t.Helper()
	if testing.Short() {
		t.Skip("runs containers; skipped in -short")
	}
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root")
	}
	sock := os.Getenv("WARREN_CONTAINERD")
	if sock == "" {
		sock = DefaultSocket
	}
	if _, err := os.Stat(sock); err != nil {
		testenv.Missing(t, "needs a running containerd at %s (apt-get install containerd runc; .ci/run starts it)", sock)
	}
	if _, err := exec.LookPath(runtime); err != nil {
		testenv.Missing(t, "needs %s (apt-get install %s)", runtime, runtime)
	}
	if _, err := guest.LoadTemplate(imageDir(), "default"); err != nil {
		testenv.Missing(t, "needs the default template: %v (run `make image`)", err)
	}
	d, err := New(Config{Socket: sock, ImageDir: imageDir(), StateDir: t.TempDir(), Namespace: "warren-test", Agent: agent, Runtime: runtime})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func run(t *testing.T, sb driver.Sandbox, script string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := sb.(driver.Interactive).Run(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", script}}, &out, &out)
	if err != nil {
		t.Fatalf("%q: %v", script, err)
	}
	return out.String(), res.ExitCode
}

func TestContainerLifecycle(t *testing.T) { testLifecycle(t, "runc", "sb-ctr", 256) }

// TestContainerGVisor runs the same life cycle under gVisor (runsc through
// the runc shim and the driver's wrapper).
// Its process limit is lower: on gVisor's ptrace platform every guest
// process costs several host threads and a fork takes milliseconds, so a
// fork bomb at 256 processes runs for minutes before the shell gives up.
func TestContainerGVisor(t *testing.T) { testLifecycle(t, "runsc", "sb-gvisor", 64) }

func testLifecycle(t *testing.T, runtime, id string, pids int) {
	d := newDriverWith(t, runtime)
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: id, Env: map[string]string{"GREETING": "hi"}, Limits: driver.Limits{Pids: pids}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("claim took %v", sb.(driver.Interactive).Info().ClaimTime)
	if _, err := d.Claim(ctx, driver.ClaimRequest{ID: id}); !errors.Is(err, driver.ErrExists) {
		t.Errorf("a second claim of %s: %v, want ErrExists", id, err)
	}
	out, code := run(t, sb, "uname -a; echo $((6*7)); echo $GREETING; hostname")
	if code != 0 || !strings.Contains(out, "Linux") || !strings.HasSuffix(out, "42\nhi\n"+id+"\n") {
		t.Fatalf("exit %d %q", code, out)
	}
	ia := sb.(driver.Interactive)
	if _, err := ia.WriteFile(ctx, "/work/a.txt", nil, strings.NewReader("kept")); err != nil {
		t.Fatal(err)
	}
	if err := ia.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ia.ListFiles(ctx, "/"); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("call on a paused sandbox: %v", err)
	}
	if err := ia.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if _, err := ia.ReadFile(ctx, "/work/a.txt", 0, &got); err != nil || got.String() != "kept" {
		t.Fatalf("after resume: %q %v", got.String(), err)
	}
	// The template's root is not written through.
	if _, err := os.Stat(filepath.Join(lowerMountOf(t, d), "work")); err == nil {
		t.Error("the write reached the template's root file system")
	}
	// A child that left its command's process group does not outlive the
	// call.
	out, code = run(t, sb, "setsid sh -c 'echo $$ > /tmp/stray; exec sleep 300' </dev/null >/dev/null 2>&1 & "+
		"for i in $(seq 100); do [ -s /tmp/stray ] && break; sleep 0.05; done; cat /tmp/stray")
	if code != 0 {
		t.Fatalf("setsid: exit %d %q", code, out)
	}
	// (A killed one may be a zombie for a moment, until init reaps it;
	// its stat is read once, as it may go between two reads.)
	stat := "/proc/" + strings.TrimSpace(out) + "/stat"
	if out, _ := run(t, sb, "s=$(cat "+stat+" 2>/dev/null); case \"$s\" in ''|*') Z '*) echo gone;; *) echo alive;; esac"); out != "gone\n" {
		t.Errorf("a setsid child after its call: %q, want gone", out)
	}
	// The fork bomb meets the pids limit; the sandbox still answers.
	out, _ = run(t, sb, "bomb() { bomb | bomb & }; bomb; sleep 3; echo done")
	if !strings.Contains(out, "Resource temporarily unavailable") && !strings.Contains(out, "Cannot fork") {
		t.Errorf("fork bomb output %q: want it stopped by the pids limit", lastLine(out))
	}
	if out, _ := run(t, sb, "echo alive"); out != "alive\n" {
		t.Fatalf("after the fork bomb: %q", out)
	}
	if runtime == "runsc" {
		goto destroy // see TestContainerGVisorMemoryHog
	}
	// A memory hog past the limit (512 MiB by default) is killed; the
	// sandbox still answers.
	out, code = run(t, sb, "python3 -c 'a = bytearray(1 << 30); print(len(a))'; echo exit=$?")
	if strings.Contains(out, "1073741824") || !strings.Contains(out, "exit=") || strings.Contains(out, "exit=0") {
		t.Errorf("memory hog: exit %d %q: want it killed", code, out)
	}
	if out, _ := run(t, sb, "echo alive"); out != "alive\n" {
		t.Fatalf("after the memory hog: %q", out)
	}
destroy:
	dir := sb.(*Box).dir
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("box directory left: %v", err)
	}
	if cs, _ := d.client.Containers(ctx); len(cs) != 0 {
		t.Errorf("%d containers left", len(cs))
	}
}

// TestContainerGVisorMemoryHog: under gVisor the sandbox's memory is the
// sentry's, in the host cgroup, and gVisor 2022-12 has no OOM killer of its
// own: a hog past the limit makes the host kill the sentry, and with it the
// whole sandbox. That is contained (fail-closed): another sandbox and the
// node keep answering, and destroying the dead one leaves nothing behind.
func TestContainerGVisorMemoryHog(t *testing.T) {
	d := newDriverWith(t, "runsc")
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var sbs []driver.Sandbox
	for _, id := range []string{"sb-hog", "sb-calm"} {
		sb, err := d.Claim(ctx, driver.ClaimRequest{ID: id, Limits: driver.Limits{Pids: 64, MemMB: 256}})
		if err != nil {
			t.Fatal(err)
		}
		sbs = append(sbs, sb)
	}
	res, err := sbs[0].(driver.Interactive).Run(ctx, guest.ExecRequest{Argv: []string{"python3", "-c", "a = bytearray(1 << 30); print(len(a))"}}, io.Discard, io.Discard)
	if err == nil && res.ExitCode == 0 {
		t.Fatalf("a 1 GiB allocation under a 256 MiB limit succeeded")
	}
	t.Logf("the hog: %+v %v", res, err)
	if out, _ := run(t, sbs[1], "echo alive"); out != "alive\n" {
		t.Fatalf("the other sandbox after the hog: %q", out)
	}
	for _, sb := range sbs {
		if err := sb.Destroy(); err != nil {
			t.Fatal(err)
		}
	}
	if cs, _ := d.client.Containers(ctx); len(cs) != 0 {
		t.Errorf("%d containers left", len(cs))
	}
}

// lowerMountOf is where d mounts the default template's root read-only.
func lowerMountOf(t *testing.T, d *Driver) string {
	tpl, err := guest.LoadTemplate(imageDir(), "default")
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(d.cfg.StateDir, "lower", tpl.Name+"@"+tpl.Version)
}

func mustTemplateDir(t *testing.T) string {
	tpl, err := guest.LoadTemplate(imageDir(), "default")
	if err != nil {
		t.Fatal(err)
	}
	return tpl.Dir
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

func TestContainerBadClaims(t *testing.T) {
	d := newDriver(t)
	defer d.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		req  driver.ClaimRequest
		want string
	}{
		{driver.ClaimRequest{ID: "x", Template: "no-such"}, `template "no-such"`},
		{driver.ClaimRequest{ID: "x", Limits: driver.Limits{VCPUs: 999}}, "limits.vcpus"},
		{driver.ClaimRequest{ID: "x", Limits: driver.Limits{DiskMB: 10}}, "limits.disk_mb 10: must be between 64 and 1048576"},
		{driver.ClaimRequest{ID: "x", Limits: driver.Limits{DiskMB: 100}}, "limits.disk_mb 100: template default's files take"},
		{driver.ClaimRequest{ID: "x", TTL: 1000 * time.Hour}, "ttl_seconds 3600000: must be between 1 and 86400"},
	} {
		if _, err := d.Claim(ctx, tc.req); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want it to mention %q", tc.req, err, tc.want)
		}
	}
}

// A runc sandbox's code cannot make namespaces of its own: the default
// seccomp profile refuses unshare and clone with namespace flags to a
// process without CAP_SYS_ADMIN. Without it, root in the container made a
// user namespace (and, holding every capability there, a network one).
// Its cgroup namespace is its own, so it does not see the host's
// hierarchy.
func TestContainerCannotMakeNamespaces(t *testing.T) {
	d := newDriver(t)
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-unshare"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	if out, code := run(t, sb, "command -v unshare"); code != 0 {
		t.Fatalf("the template has no unshare(1) (util-linux): exit %d %q", code, out)
	}
	for _, script := range []string{"unshare --user true", "unshare --user --map-root-user --net true", "unshare --cgroup true"} {
		out, code := run(t, sb, script+" 2>&1")
		if code == 0 || !strings.Contains(out, "Operation not permitted") {
			t.Errorf("%q in the container: exit %d %q, want it refused (Operation not permitted)", script, code, out)
		}
	}
	// Each hierarchy's line ("4:memory:/", "0::/") names its root, v1 or v2.
	out, code := run(t, sb, "cat /proc/self/cgroup")
	if code != 0 || out == "" {
		t.Fatalf("/proc/self/cgroup in the container: exit %d %q", code, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.HasSuffix(line, ":/") {
			t.Errorf("/proc/self/cgroup in the container has %q, want each path / (a cgroup namespace of its own)", line)
		}
	}
}

// A Close while a claim is under way leaves no container behind: the
// claim sees the driver closed and destroys its own container (Close
// waits for it, so the containerd client is still open). It used to
// register the box after Close had destroyed everything and closed the
// client, so its container stayed until the node's next start.
func TestCloseDuringClaimLeavesNoContainer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for i := range 4 {
		d := newDriver(t)
		sock, scope := d.cfg.Socket, d.scope
		done := make(chan error, 1)
		go func() {
			_, err := d.Claim(ctx, driver.ClaimRequest{ID: fmt.Sprintf("sb-closeclaim%d", i)})
			done <- err
		}()
		time.Sleep(time.Duration(40*i) * time.Millisecond) // at various points of the claim
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		err := <-done
		c, cerr := containerd.New(sock, containerd.WithDefaultNamespace("warren-test"))
		if cerr != nil {
			t.Fatal(cerr)
		}
		cs, lerr := c.Containers(ctx, fmt.Sprintf("labels.%q==%s", label, scope))
		c.Close()
		if lerr != nil {
			t.Fatal(lerr)
		}
		if len(cs) != 0 {
			t.Errorf("round %d (claim: %v): %d containers left after Close", i, err, len(cs))
		}
	}
}

// A command that a destroy cuts off ends with ErrNotFound saying the
// sandbox was destroyed while it ran (it was the channel's "guest: EOF",
// which the API answered as internal).
func TestCallCutOffByADestroySaysSo(t *testing.T) {
	d := newDriver(t)
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-cutoff"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	started := make(chan struct{}, 1)
	go func() {
		_, err := sb.(driver.Interactive).Run(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo started; sleep 60"}}, signalWriter(started), io.Discard)
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("the command ended: %v", err)
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, driver.ErrNotFound) || !strings.Contains(err.Error(), "destroyed while the call ran") {
			t.Fatalf("the cut-off call: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the call did not end")
	}
}

// signalWriter signals c (without blocking) at each write.
type signalWriter chan struct{}

func (w signalWriter) Write(p []byte) (int, error) {
	select {
	case w <- struct{}{}:
	default:
	}
	return len(p), nil
}

// A container's disk is bounded: a dd that fills it gets ENOSPC, in its
// root and in /run/warren alike, the node's disk holds at most the quota
// for it, the sandbox keeps answering, and destroying it leaves no mount
// or loop device behind. Without a quota of its own the box gets its
// template's disk, as a microVM does.
func TestContainerDiskIsBounded(t *testing.T) { testDiskIsBounded(t, "runc") }

// TestContainerGVisorDiskIsBounded: the same under gVisor, whose gofer
// writes the box's files on the host.
func TestContainerGVisorDiskIsBounded(t *testing.T) { testDiskIsBounded(t, "runsc") }

func testDiskIsBounded(t *testing.T, runtime string) {
	d := newDriverWith(t, runtime)
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tpl, err := guest.LoadTemplate(imageDir(), "default")
	if err != nil {
		t.Fatal(err)
	}

	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-disk-default"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sb.(driver.Interactive).Info().Limits.DiskMB, int(tpl.DiskBytes>>20); got != want {
		t.Errorf("default disk %d MiB, want the template's %d", got, want)
	}
	// The image is sparse: a new box takes ext4's metadata of the node's
	// disk, not its quota.
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(sb.(*Box).dir, diskImage), &st); err != nil {
		t.Fatal(err)
	}
	if on := st.Blocks * 512; on > 64<<20 {
		t.Errorf("a new box's disk image takes %d MiB of the node's disk", on>>20)
	}
	lower := lowerMountOf(t, d)
	u, err := used(lower)
	if err != nil {
		t.Fatal(err)
	}
	// df in the sandbox sees the box's own file system: the template's
	// disk less its files (ext4 keeps some of it for itself).
	out, code := run(t, sb, "df -P -B1M / | tail -1")
	var fs string
	var size int64
	if _, err := fmt.Sscan(out, &fs, &size); code != 0 || err != nil {
		t.Fatalf("df: exit %d %q %v", code, out, err)
	}
	if free := tpl.DiskBytes>>20 - u>>20; size > free || size < free*9/10 {
		t.Errorf("df / in the sandbox: %d MiB, want about %d (the template's disk less its files)", size, free)
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}

	diskMB := int(u>>20) + 80
	sb, err = d.Claim(ctx, driver.ClaimRequest{ID: "sb-disk", Limits: driver.Limits{DiskMB: diskMB}})
	if err != nil {
		t.Fatal(err)
	}
	dir := sb.(*Box).dir
	for _, p := range []string{"/root/fill", "/run/warren/fill"} {
		out, _ := run(t, sb, "dd if=/dev/zero of="+p+" bs=1M count=1000 2>&1; echo exit=$?")
		if !strings.Contains(out, "No space left on device") || strings.Contains(out, "exit=0") {
			t.Errorf("dd to %s: %q, want it stopped by the disk quota", p, out)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(dir, diskImage), &st); err != nil {
			t.Fatal(err)
		}
		if on := st.Blocks * 512; on > int64(diskMB-int(u>>20))<<20 {
			t.Errorf("after dd to %s the box takes %d MiB of the node's disk, over its %d MiB", p, on>>20, diskMB-int(u>>20))
		}
		if out, _ := run(t, sb, "rm "+p+"; echo alive"); out != "alive\n" {
			t.Fatalf("after the disk filled: %q", out)
		}
	}
	if out, _ := run(t, sb, "echo kept > /root/after && cat /root/after"); out != "kept\n" {
		t.Errorf("a write after the fill was removed: %q", out)
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("box directory left: %v", err)
	}
	waitNoLoops(t, dir)
	if isMounted(filepath.Join(dir, diskMount)) || isMounted(filepath.Join(dir, "rootfs")) {
		t.Error("a mount of the box is left")
	}
}

// waitNoLoops fails the test unless, within 5 s, no loop device has its
// backing file under dir: a box's loop device detaches itself when its
// file system is unmounted, at the last user's release.
func waitNoLoops(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := loopsUnder(dir)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("loop devices left on a box's disk under %s: %v", dir, left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// loopsUnder lists the loop devices whose backing file is under dir.
func loopsUnder(dir string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
			out = append(out, f+": "+strings.TrimSpace(string(b)))
		}
	}
	return out
}

// A node that restarts after a crash destroys the boxes its previous run
// left: their containers, mounts (root and disk), loop devices and
// directories.
func TestRestartCleansUpLeftBoxes(t *testing.T) {
	d := newDriver(t)
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-left"})
	if err != nil {
		t.Fatal(err)
	}
	dir := sb.(*Box).dir
	if out, code := run(t, sb, "echo x > /root/x && echo ok"); code != 0 || out != "ok\n" {
		t.Fatalf("write: exit %d %q", code, out)
	}
	// The "restarted" node: a second driver on the same state directory,
	// while the first (the crashed run) is never closed.
	d2, err := New(d.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("box directory left: %v", err)
	}
	if isMounted(filepath.Join(dir, diskMount)) || isMounted(filepath.Join(dir, "rootfs")) {
		t.Error("a mount of the left box is left")
	}
	if cs, _ := d2.client.Containers(ctx, fmt.Sprintf("labels.%q==%s", label, d2.scope)); len(cs) != 0 {
		t.Errorf("%d containers of this state dir left", len(cs))
	}
	waitNoLoops(t, dir)
}

// A pause or resume is carried out whatever its caller does: the shim
// finishes a change it began, so one cut short by its caller left the
// box saying the opposite of the container, and every later call and
// change refused. And a sandbox gets no swap beyond its memory limit.
func TestContainerPauseAndResumeOutliveTheirCaller(t *testing.T) {
	d := newDriverWith(t, "runc")
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const id = "sb-outlive"
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	gone, end := context.WithCancel(ctx)
	end()
	ia := sb.(driver.Interactive)
	if err := ia.Pause(gone); err != nil {
		t.Fatalf("a pause whose caller had gone: %v", err)
	}
	if _, err := ia.ListFiles(ctx, "/"); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("a call after that pause: %v, want it refused as paused", err)
	}
	if err := ia.Resume(gone); err != nil {
		t.Fatalf("a resume whose caller had gone: %v", err)
	}
	if out, code := run(t, sb, "echo back"); code != 0 || out != "back\n" {
		t.Fatalf("after the resume: exit %d %q", code, out)
	}
	// No swap past the limit (cgroup v1 with swap accounting, as here).
	dirs, _ := filepath.Glob("/sys/fs/cgroup/memory/*/" + id)
	if len(dirs) != 1 {
		t.Skipf("no v1 memory cgroup of %s found (%v): the swap limit is not checked", id, dirs)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dirs[0], name))
		if err != nil {
			t.Skipf("%s: %v", name, err)
		}
		return strings.TrimSpace(string(b))
	}
	if mem, memsw := read("memory.limit_in_bytes"), read("memory.memsw.limit_in_bytes"); mem != memsw {
		t.Errorf("memory limit %s, memory and swap %s: want the same (no swap)", mem, memsw)
	}
}

// A sandbox whose agent died is destroyed at the next call, which gets
// ErrNotFound: every call failed with the channel's error until its TTL,
// and a task actor retried it instead of claiming another.
func TestAContainerWhoseAgentDiedIsGone(t *testing.T) {
	d := newDriverWith(t, "runc")
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-agentdies"})
	if err != nil {
		t.Fatal(err)
	}
	ia := sb.(driver.Interactive)
	// The command's parent is the agent serving the host's session.
	_, err = ia.Run(ctx, guest.ExecRequest{Argv: []string{"sh", "-c", "kill -KILL $PPID; sleep 5"}}, io.Discard, io.Discard)
	if !errors.Is(err, driver.ErrNotFound) {
		// The call may have ended before the host saw the session close:
		// the next one sees it.
		_, err = ia.ListFiles(ctx, "/")
	}
	if !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("a call after the agent died: %v, want ErrNotFound", err)
	}
	if _, ok := d.Get("sb-agentdies"); ok {
		t.Error("the sandbox is still listed")
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if cs, _ := d.client.Containers(ctx); len(cs) != 0 {
		t.Errorf("%d containers left", len(cs))
	}
}

// A destroy whose container would not go in time (destroyWait) leaves the
// box tracked, with its network and directory, and the driver deletes the
// container on a later try, then frees the rest. It dropped the network,
// directory and box at once and forgot the container, which ran on,
// unlisted and with no TTL, until the node's next start.
func TestAContainerNotDeletedInTimeIsDeletedLater(t *testing.T) {
	d := newDriver(t)
	defer d.Close()
	oldWait, oldEvery := destroyWait, retryDestroyEvery
	destroyWait, retryDestroyEvery = time.Millisecond, 200*time.Millisecond
	t.Cleanup(func() { destroyWait, retryDestroyEvery = oldWait, oldEvery })
	ctx := context.Background()
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-slow-destroy"})
	if err != nil {
		t.Fatal(err)
	}
	dir := sb.(*Box).dir
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.LoadContainer(ctx, "sb-slow-destroy"); err != nil {
		t.Fatalf("the container went within %v: the test proves nothing (%v)", destroyWait, err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("the box's directory went while its container runs: %v", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := d.client.LoadContainer(ctx, "sb-slow-destroy")
		if errdefs.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the container is still there a minute after its destroy (%v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for {
		_, tracked := d.Get("sb-slow-destroy")
		_, err := os.Stat(dir)
		if !tracked && os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after its container went, the box is tracked %v, its directory %v", tracked, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
