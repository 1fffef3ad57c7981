package image

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
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
	removed := prune(root, "d", 2)
	if strings.Join(removed, ",") != "b,a" {
		t.Fatalf("removed %v, want b,a", removed)
	}
	for _, v := range []string{"c", "d"} {
		if _, err := os.Stat(filepath.Join(root, v)); err != nil {
			t.Errorf("%s was removed", v)
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
