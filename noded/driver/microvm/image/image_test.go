package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/guest"
)

func TestModuleOrderPutsDependenciesFirst(t *testing.T) {
	dir := t.TempDir()
	dep := strings.Join([]string{
		"kernel/fs/ext4/ext4.ko: kernel/fs/jbd2/jbd2.ko kernel/fs/mbcache.ko kernel/lib/crc16.ko",
		"kernel/fs/jbd2/jbd2.ko:",
		"kernel/fs/mbcache.ko:",
		"kernel/lib/crc16.ko:",
		"kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko",
		"kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko",
		"kernel/drivers/virtio/virtio_ring.ko:",
		"kernel/crypto/crc32c_generic.ko:",
	}, "\n")
	os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644)
	os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte("kernel/drivers/char/virtio_console.ko\n"), 0o644)
	got, err := moduleOrder(dir, []string{"virtio_blk", "ext4", "crc32c-generic", "virtio_console"})
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, m := range got {
		pos[filepath.Base(m)] = i
	}
	if len(got) != 8 {
		t.Fatalf("got %v", got)
	}
	for _, before := range [][2]string{{"virtio_ring.ko", "virtio.ko"}, {"virtio.ko", "virtio_blk.ko"}, {"jbd2.ko", "ext4.ko"}, {"crc16.ko", "ext4.ko"}} {
		if pos[before[0]] >= pos[before[1]] {
			t.Errorf("%s loads after %s: %v", before[0], before[1], got)
		}
	}
	if _, err := moduleOrder(dir, []string{"no_such_module"}); err == nil || !strings.Contains(err.Error(), "no_such_module") {
		t.Errorf("missing module: %v", err)
	}
}

// warren's own kernel (deploy/kernel) has every guest module built in: an
// empty modules.dep and a modules.builtin naming them give no module to
// load, and one missing from both is an error naming it.
func TestModuleOrderAllBuiltIn(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "modules.dep"), nil, 0o644)
	builtin := []string{"kernel/drivers/virtio/virtio_mmio.ko", "kernel/drivers/char/virtio_console.ko",
		"kernel/drivers/block/virtio_blk.ko", "kernel/drivers/net/virtio_net.ko", "kernel/drivers/char/hw_random/virtio-rng.ko",
		"kernel/crypto/crc32c_generic.ko", "kernel/fs/ext4/ext4.ko"}
	os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte(strings.Join(builtin, "\n")+"\n"), 0o644)
	got, err := moduleOrder(dir, GuestModules)
	if err != nil || len(got) != 0 {
		t.Fatalf("moduleOrder = %v, %v; want nothing to load", got, err)
	}
	os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte(strings.Join(builtin[1:], "\n")+"\n"), 0o644)
	if _, err := moduleOrder(dir, GuestModules); err == nil || !strings.Contains(err.Error(), "virtio_mmio") {
		t.Errorf("virtio_mmio neither loadable nor built in: err %v", err)
	}
}

// The initramfs is the kernel's "newc" cpio: check the headers a reader
// needs (magic, mode, sizes, name) and the 4-byte alignment.
func TestCpioNewc(t *testing.T) {
	var b bytes.Buffer
	w := &cpioWriter{w: &b}
	w.Dir("etc")
	w.File("etc/hello", 0o644, []byte("hi\n"))
	w.Char("dev/console", 5, 1)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	data := b.Bytes()
	var names []string
	for off := 0; off < len(data); {
		h := string(data[off : off+110])
		if h[:6] != "070701" {
			t.Fatalf("bad magic at %d: %q", off, h[:6])
		}
		field := func(i int) int64 {
			v, err := strconv.ParseInt(h[6+8*i:14+8*i], 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		mode, size, nameLen := field(1), field(6), field(11)
		name := string(data[off+110 : off+110+int(nameLen)-1])
		names = append(names, name)
		if name == "etc/hello" && (mode != 0o100644 || size != 3) {
			t.Errorf("etc/hello: mode %o size %d", mode, size)
		}
		if name == "dev/console" && (field(9) != 5 || field(10) != 1) {
			t.Errorf("dev/console: rdev %d,%d", field(9), field(10))
		}
		off += 110 + int(nameLen)
		off = (off + 3) &^ 3
		off += int(size)
		off = (off + 3) &^ 3
		if name == "TRAILER!!!" {
			break
		}
	}
	if strings.Join(names, ",") != "etc,etc/hello,dev/console,TRAILER!!!" {
		t.Fatalf("entries %v", names)
	}
}

func TestPruneKeepsTheNewest(t *testing.T) {
	root := t.TempDir()
	now := time.Now()
	for i, v := range []string{"a", "b", "c", "d"} {
		os.MkdirAll(filepath.Join(root, v), 0o755)
		m := filepath.Join(root, v, "manifest.json")
		os.WriteFile(m, []byte("{}"), 0o644)
		os.Chtimes(m, now.Add(time.Duration(i)*time.Minute), now.Add(time.Duration(i)*time.Minute))
	}
	os.MkdirAll(filepath.Join(root, ".hidden"), 0o755)
	os.WriteFile(filepath.Join(root, ".hidden", "manifest.json"), []byte("{}"), 0o644)
	removed := prune(root, "d", "", 2)
	if strings.Join(removed, ",") != "b,a" {
		t.Fatalf("removed %v, want b,a", removed)
	}
	for _, v := range []string{"c", "d", ".hidden"} {
		if _, err := os.Stat(filepath.Join(root, v)); err != nil {
			t.Errorf("%s was removed", v)
		}
	}
}

// The version current named before the build may be running on a node
// (which loads a template once): prune never removes it, even past keep.
func TestPruneSparesThePreviousVersion(t *testing.T) {
	root := t.TempDir()
	now := time.Now()
	for i, v := range []string{"a", "b", "c"} {
		os.MkdirAll(filepath.Join(root, v), 0o755)
		m := filepath.Join(root, v, "manifest.json")
		os.WriteFile(m, []byte("{}"), 0o644)
		os.Chtimes(m, now.Add(time.Duration(i)*time.Minute), now.Add(time.Duration(i)*time.Minute))
	}
	// c is new and current; a was current before it (b, newer than a,
	// was made current by hand and rolled back, say).
	if removed := prune(root, "c", "a", 1); strings.Join(removed, ",") != "b" {
		t.Fatalf("removed %v, want b", removed)
	}
	if _, err := os.Stat(filepath.Join(root, "a")); err != nil {
		t.Errorf("the previous version was removed: %v", err)
	}
}

func TestNewestKernel(t *testing.T) {
	for _, c := range []struct {
		paths []string
		want  string
	}{
		{[]string{"/boot/vmlinuz-6.1.0-57-amd64"}, "/boot/vmlinuz-6.1.0-57-amd64"},
		{[]string{"/boot/vmlinuz-6.1.0-9-amd64", "/boot/vmlinuz-6.1.0-57-amd64"}, "/boot/vmlinuz-6.1.0-57-amd64"},
		{[]string{"/boot/vmlinuz-6.1.0-57-amd64", "/boot/vmlinuz-6.1.0-9-amd64"}, "/boot/vmlinuz-6.1.0-57-amd64"},
		{[]string{"/boot/vmlinuz-5.10.0-30-amd64", "/boot/vmlinuz-6.1.0-1-amd64", "/boot/vmlinuz-5.19.0-99-amd64"}, "/boot/vmlinuz-6.1.0-1-amd64"},
		{[]string{"/boot/vmlinuz-6.10.0-1-amd64", "/boot/vmlinuz-6.9.0-1-amd64"}, "/boot/vmlinuz-6.10.0-1-amd64"},
		{[]string{"/boot/vmlinuz-6.1.0-09-amd64", "/boot/vmlinuz-6.1.0-10-amd64"}, "/boot/vmlinuz-6.1.0-10-amd64"},
		{[]string{"/boot/vmlinuz-6.1.0-57-amd64", "/boot/vmlinuz-6.1.0-57-amd64-dbg"}, "/boot/vmlinuz-6.1.0-57-amd64-dbg"},
	} {
		if got := newestKernel(c.paths); got != c.want {
			t.Errorf("newestKernel(%v) = %s, want %s", c.paths, got, c.want)
		}
	}
}

// A template with a uniprocessor kernel carries one initramfs for both
// kernels, so neither may need a guest module loaded; the error names the
// modules.
func TestAllBuiltInRefusesModules(t *testing.T) {
	builtinDir, modsDir := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(builtinDir, "modules.dep"), nil, 0o644)
	var builtin []string
	for _, m := range GuestModules {
		builtin = append(builtin, "kernel/x/"+strings.ReplaceAll(m, "_", "-")+".ko")
	}
	os.WriteFile(filepath.Join(builtinDir, "modules.builtin"), []byte(strings.Join(builtin, "\n")+"\n"), 0o644)
	if err := allBuiltIn(builtinDir, builtinDir); err != nil {
		t.Fatalf("all built in: %v", err)
	}
	os.WriteFile(filepath.Join(modsDir, "modules.dep"), []byte("kernel/drivers/virtio/virtio_mmio.ko:\n"), 0o644)
	os.WriteFile(filepath.Join(modsDir, "modules.builtin"), []byte(strings.Join(builtin[1:], "\n")+"\n"), 0o644)
	err := allBuiltIn(builtinDir, modsDir)
	if err == nil || !strings.Contains(err.Error(), "virtio_mmio.ko") || !strings.Contains(err.Error(), modsDir) {
		t.Errorf("a kernel with virtio_mmio as a module: %v", err)
	}
}

// Build refuses a bad --kernel-up before it starts work, naming the flag.
func TestBuildChecksKernelUP(t *testing.T) {
	for _, tool := range []string{"debootstrap", "mkfs.ext4", "xz"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (apt-get install debootstrap e2fsprogs xz-utils)", tool)
		}
	}
	dir := t.TempDir()
	builtin, mods := filepath.Join(dir, "builtin"), filepath.Join(dir, "mods")
	os.MkdirAll(builtin, 0o755)
	os.MkdirAll(mods, 0o755)
	var names []string
	for _, m := range GuestModules {
		names = append(names, "kernel/x/"+m+".ko")
	}
	os.WriteFile(filepath.Join(builtin, "modules.dep"), nil, 0o644)
	os.WriteFile(filepath.Join(builtin, "modules.builtin"), []byte(strings.Join(names, "\n")+"\n"), 0o644)
	os.WriteFile(filepath.Join(mods, "modules.dep"), []byte(strings.Join(names, ":\n")+":\n"), 0o644)
	os.WriteFile(filepath.Join(mods, "modules.builtin"), nil, 0o644)
	kernel, agent := filepath.Join(dir, "vmlinuz-6.1.0-test"), filepath.Join(dir, "warren-guest")
	os.WriteFile(kernel, []byte("not a kernel"), 0o644)
	os.WriteFile(agent, []byte("not an agent"), 0o755)
	for _, c := range []struct {
		kernelUP, modules, modulesUP, want string
	}{
		{filepath.Join(dir, "vmlinuz-missing"), builtin, builtin, "kernel-up: kernel: "},
		{kernel, builtin, filepath.Join(dir, "none"), "kernel-up: kernel " + kernel + ": modules: "},
		{kernel, mods, builtin, "kernel-up: the kernel of " + mods + " has guest drivers as modules"},
	} {
		_, err := Build(context.Background(), Config{Name: "t", Out: filepath.Join(dir, "store"), Agent: agent, FreeMB: 1024,
			Kernel: kernel, Modules: c.modules, KernelUP: c.kernelUP, ModulesUP: c.modulesUP})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("kernel-up %s, modules %s, modules-up %s: %v; want %q", c.kernelUP, c.modules, c.modulesUP, err, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "store")); !os.IsNotExist(err) {
		t.Errorf("a refused build left the store: %v", err)
	}
}

// buildFixture makes a Config that Build runs without debootstrap or
// QEMU: a vmlinuz whose xz payload is an ELF header, a modules directory
// with every guest driver built in, and a debootstrap cache marked done.
func buildFixture(t *testing.T) Config {
	t.Helper()
	for _, tool := range []string{"debootstrap", "mkfs.ext4", "xz", "du"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (apt-get install debootstrap e2fsprogs xz-utils)", tool)
		}
	}
	dir := t.TempDir()
	elf := append([]byte("\x7fELF"), bytes.Repeat([]byte{0}, 60)...)
	xzc := exec.Command("xz", "-c")
	xzc.Stdin = bytes.NewReader(elf)
	payload, err := xzc.Output()
	if err != nil {
		t.Fatal(err)
	}
	kernel := filepath.Join(dir, "vmlinuz-6.1.0-test")
	os.WriteFile(kernel, append([]byte("bzImage header"), payload...), 0o644)
	mods := filepath.Join(dir, "mods")
	os.MkdirAll(mods, 0o755)
	var names []string
	for _, m := range GuestModules {
		names = append(names, "kernel/x/"+m+".ko")
	}
	os.WriteFile(filepath.Join(mods, "modules.dep"), nil, 0o644)
	os.WriteFile(filepath.Join(mods, "modules.builtin"), []byte(strings.Join(names, "\n")+"\n"), 0o644)
	c := Config{Name: "default", Out: filepath.Join(dir, "store"), Agent: filepath.Join(dir, "warren-guest"),
		Kernel: kernel, Modules: mods, Suite: "bookworm", Mirror: "http://mirror.invalid/debian", FreeMB: 64, Keep: 2}
	os.WriteFile(c.Agent, []byte("agent"), 0o755)
	fakeRootfsCache(c)
	return c
}

// fakeRootfsCache puts a finished debootstrap tree in c's store.
func fakeRootfsCache(c Config) {
	pkgs := append(append([]string(nil), DefaultPackages...), c.Packages...)
	root := filepath.Join(c.Out, ".cache", c.Name+"-rootfs-"+shortHash(c.Suite+c.Mirror+strings.Join(pkgs, ",")))
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc", "hostname"), []byte("test\n"), 0o644)
	os.WriteFile(filepath.Join(root, ".warren-done"), nil, 0o644)
}

// A version whose smoke boot failed never enters the store: it is not
// one of the versions --keep keeps (with --keep 2 the next good build
// would otherwise remove the last version that booted), and the next
// build removes it.
func TestBuildKeepsTheLastGoodVersionOverAFailedSmokeBoot(t *testing.T) {
	c := buildFixture(t)
	build := func(agent string, smokeErr error) (*guest.Template, error) {
		os.WriteFile(c.Agent, []byte(agent), 0o755)
		cc := c
		cc.Smoke = func(context.Context, *guest.Template) (string, time.Duration, error) {
			if smokeErr != nil {
				return "", 0, smokeErr
			}
			return "tcg", time.Second, nil
		}
		return Build(context.Background(), cc)
	}
	good, err := build("agent v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = build("agent v2", errors.New("agent did not answer"))
	if err == nil || !strings.Contains(err.Error(), "agent did not answer") {
		t.Fatalf("a failed smoke boot: %v", err)
	}
	failed, _ := filepath.Glob(filepath.Join(buildDirOf(c.Out, "default"), "failed-*"))
	if len(failed) != 1 || !strings.Contains(err.Error(), failed[0]) {
		t.Errorf("the failed version is not kept where the error says: %v, %v", failed, err)
	}
	if vs, _ := filepath.Glob(filepath.Join(c.Out, "default", "*", "manifest.json")); len(vs) != 2 { // good and current
		t.Errorf("versions in the store after a failed smoke boot: %v", vs)
	}
	if _, err := build("agent v3", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(good.Dir); err != nil {
		t.Errorf("--keep 2 removed %s, the last version that passed its smoke boot: %v", good.Version, err)
	}
	if _, err := os.Stat(failed[0]); !os.IsNotExist(err) {
		t.Errorf("the next build left the failed version: %v", err)
	}
}

// exitAt is a progress writer that ends the process (as SIGKILL or a
// power cut would: no deferred call runs) when Build reports a step.
type exitAt struct{ step string }

func (w exitAt) Write(p []byte) (int, error) {
	if strings.Contains(string(p), w.step) {
		os.Exit(3)
	}
	return len(p), nil
}

// A build killed before it renames its work directory leaves it (the
// whole template); the next build removes it.
func TestBuildRemovesAKilledBuildsWorkDir(t *testing.T) {
	if store := os.Getenv("WARREN_TEST_CRASH_STORE"); store != "" {
		c := buildFixture(t)
		c.Out = store
		fakeRootfsCache(c)
		c.Progress = exitAt{"mkfs.ext4 with"}
		Build(context.Background(), c)
		return
	}
	store := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestBuildRemovesAKilledBuildsWorkDir$", "-test.count=1")
	cmd.Env = append(os.Environ(), "WARREN_TEST_CRASH_STORE="+store)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("the killed build: %v\n%s", err, out)
	}
	// The lock stays; the work directories are what matters.
	workDirs := func() []string {
		ds, _ := filepath.Glob(filepath.Join(buildDirOf(store, "default"), "[^.]*"))
		return ds
	}
	if len(workDirs()) == 0 {
		t.Fatal("the killed build left nothing (the crash came too early)")
	}
	c := buildFixture(t)
	c.Out = store
	fakeRootfsCache(c)
	if _, err := Build(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if still := workDirs(); len(still) != 0 {
		t.Errorf("after a good build, a dead build's work directory is still in the store: %v", still)
	}
}

// Builds of one template run one at a time: a second one is refused,
// naming the lock, and leaves the first one's work alone.
func TestBuildRefusesAConcurrentBuild(t *testing.T) {
	c := buildFixture(t)
	unlock, err := lockBuild(c.Name, buildDirOf(c.Out, "default"))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	work := filepath.Join(buildDirOf(c.Out, "default"), "123")
	os.MkdirAll(work, 0o755)
	_, err = Build(context.Background(), c)
	if err == nil || !strings.Contains(err.Error(), "another build of template default is running") {
		t.Fatalf("a build while another runs: %v", err)
	}
	if _, err := os.Stat(work); err != nil {
		t.Errorf("the refused build touched the running one's work: %v", err)
	}
}

// A vmlinuz whose xz stream is cut short (a truncated copy) is refused,
// not uncompressed into a partial kernel that starts like an ELF file.
func TestExtractVmlinuxRefusesATruncatedKernel(t *testing.T) {
	if _, err := exec.LookPath("xz"); err != nil {
		t.Skip("needs xz (apt-get install xz-utils)")
	}
	dir := t.TempDir()
	// An ELF header and 4 MiB that do not compress, so xz writes out
	// what it decoded before it finds the end missing.
	body := make([]byte, 4<<20)
	x := uint32(1)
	for i := range body {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		body[i] = byte(x)
	}
	elf := append([]byte("\x7fELF"), body...)
	xzc := exec.Command("xz", "-c", "-0")
	xzc.Stdin = bytes.NewReader(elf)
	payload, err := xzc.Output()
	if err != nil {
		t.Fatal(err)
	}
	whole, cut := filepath.Join(dir, "vmlinuz-6.1.0-whole"), filepath.Join(dir, "vmlinuz-6.1.0-cut")
	os.WriteFile(whole, append(append([]byte("bzImage header"), payload...), "trailer"...), 0o644)
	os.WriteFile(cut, append([]byte("bzImage header"), payload[:len(payload)/2]...), 0o644)
	out := filepath.Join(dir, "vmlinux")
	if err := extractVmlinux(whole, out); err != nil {
		t.Fatalf("a whole kernel with bytes after its xz stream: %v", err)
	}
	if fi, _ := os.Stat(out); fi == nil || fi.Size() != int64(len(elf)) {
		t.Fatalf("a whole kernel uncompressed to %v, want %d bytes", fi, len(elf))
	}
	if err := extractVmlinux(cut, out); err == nil || !strings.Contains(err.Error(), cut) {
		t.Errorf("a vmlinuz with half its xz stream: %v", err)
	}
}

// A template's name must be one the servers take (api.TemplateNameRE):
// one they refuse could never be used, and every node that advertised it
// had its hello refused.
func TestBuildRefusesNamesTheServersRefuse(t *testing.T) {
	for _, name := range []string{"MyTpl", "foo+bar", "foo:bar", "a/b", ".x", "", strings.Repeat("a", 129)} {
		c := Config{Name: name, Out: t.TempDir(), Agent: "/nonexistent", FreeMB: 1024}
		if err := c.validate(); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("name %q: must be 1-128 of a-z", name)) {
			t.Errorf("name %q: %v", name, err)
		}
	}
	for _, name := range []string{"default", "py3.11", "node_20-slim"} {
		c := Config{Name: name, Out: t.TempDir(), Agent: "/nonexistent", FreeMB: 1024}
		if err := c.validate(); err != nil && strings.Contains(err.Error(), "name ") {
			t.Errorf("name %q refused: %v", name, err)
		}
	}
}

// A template's builds work outside every template's directory: building
// "py" leaves the template "py-build" whole (before, its build directory
// was <store>/py-build, which the build emptied), and a build of
// "py-build" does not count py's build work among its versions.
func TestBuildOfATemplateLeavesTheTemplateNamedItsBuildDir(t *testing.T) {
	c := buildFixture(t)
	build := func(name, agent string) *guest.Template {
		t.Helper()
		cc := c
		cc.Name = name
		os.WriteFile(cc.Agent, []byte(agent), 0o755)
		fakeRootfsCache(cc)
		tpl, err := Build(context.Background(), cc)
		if err != nil {
			t.Fatalf("build %s: %v", name, err)
		}
		return tpl
	}
	pyBuild := build("py-build", "agent 1")
	build("py", "agent 2")
	got, err := guest.LoadTemplate(c.Out, "py-build")
	if err != nil || got.Version != pyBuild.Version {
		t.Fatalf("template py-build after a build of py: %v, %v", got, err)
	}
	if err := got.Verify(); err != nil {
		t.Errorf("template py-build after a build of py: %v", err)
	}
	if names := guest.ListTemplates(c.Out); !slices.Equal(names, []string{"py", "py-build"}) {
		t.Errorf("templates %v, want [py py-build]", names)
	}
	build("py-build", "agent 3")
	if _, err := guest.LoadTemplate(c.Out, "py"); err != nil {
		t.Errorf("template py after a build of py-build: %v", err)
	}
	if _, err := guest.LoadTemplate(c.Out, "py-build@"+pyBuild.Version); err != nil {
		t.Errorf("py-build's first version (--keep 2): %v", err)
	}
}

// A build directory of the old layout, <store>/<name>-build, is removed
// only when it is one: it has a build's .lock, no current (which the
// template of that name would have), and no build holds its lock.
func TestRemoveOldBuildDir(t *testing.T) {
	store := t.TempDir()
	mk := func(name string, entries ...string) string {
		dir := filepath.Join(store, name)
		os.MkdirAll(filepath.Join(dir, "123"), 0o755)
		for _, e := range entries {
			if e == "current" {
				os.Symlink("123", filepath.Join(dir, e))
			} else {
				os.WriteFile(filepath.Join(dir, e), nil, 0o644)
			}
		}
		return dir
	}
	stale := mk("a-build", ".lock")
	template := mk("b-build", ".lock", "current")
	noLock := mk("c-build")
	held := mk("d-build", ".lock")
	unlock, err := lockBuild("d", held)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	os.MkdirAll(filepath.Join(held, "456"), 0o755) // lockBuild emptied it
	for _, dir := range []string{stale, template, noLock, held} {
		removeOldBuildDir(dir)
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an old build directory is still there: %v", err)
	}
	for _, dir := range []string{template, noLock, filepath.Join(held, "456")} {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("%s was removed: %v", dir, err)
		}
	}
}

// A build keeps only its own cached debootstrap tree of the template: one
// of an earlier package set goes; other templates' stay, names that share
// a prefix included. Nothing removed them before (1-2 GB each).
func TestPruneRootfsCache(t *testing.T) {
	out := t.TempDir()
	mk := func(name string) string {
		dir := filepath.Join(out, ".cache", name)
		if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	keep := mk("py-rootfs-" + shortHash("now"))
	old := mk("py-rootfs-" + shortHash("before"))
	lookalike := mk("py-rootfs-rootfs-" + shortHash("x")) // template py-rootfs's
	other := mk("go-rootfs-" + shortHash("y"))
	pruneRootfsCache(out, "py", keep)
	for dir, want := range map[string]bool{keep: true, old: false, lookalike: true, other: true} {
		if _, err := os.Stat(dir); (err == nil) != want {
			t.Errorf("%s: kept %v, want %v", filepath.Base(dir), err == nil, want)
		}
	}
}
