package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/internal/testenv"
	"github.com/warrenhq/warren/noded/driver/microvm"
)

// --driver auto picks microvm when QEMU and the default template are
// present, otherwise container, and says which it picked and why.
func TestAutoDriver(t *testing.T) {
	empty := t.TempDir()

	t.Run("no QEMU", func(t *testing.T) {
		t.Setenv("PATH", empty)
		name, why := autoDriver(empty)
		if name != "container" || !strings.Contains(why, "qemu-system-x86_64 is not installed") {
			t.Errorf("without QEMU: %q, %q", name, why)
		}
	})

	t.Run("no template", func(t *testing.T) {
		bin := t.TempDir()
		if err := os.WriteFile(filepath.Join(bin, "qemu-system-x86_64"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		t.Setenv("PATH", bin)
		name, why := autoDriver(empty)
		if name != "container" || !strings.Contains(why, "no default template in "+empty) || !strings.Contains(why, "make image") {
			t.Errorf("without a template: %q, %q", name, why)
		}
	})

	t.Run("QEMU and the template", func(t *testing.T) {
		if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
			testenv.Missing(t, "needs qemu-system-x86 (apt-get install qemu-system-x86)")
		}
		dir := os.Getenv("WARREN_IMAGE_DIR")
		if dir == "" {
			dir = microvm.DefaultImageDir
		}
		tpl, err := guest.LoadTemplate(dir, "default")
		if err != nil {
			testenv.Missing(t, "needs the default template: %v (run `make image`)", err)
		}
		name, why := autoDriver(dir)
		if name != "microvm" || !strings.Contains(why, "template "+tpl.Name+"@"+tpl.Version) {
			t.Errorf("with QEMU and the template: %q, %q", name, why)
		}
	})
}

// When auto picks microvm and the driver does not start, the error says
// that auto picked it and why, as it does for container; it said only
// the driver's own error, and a node meant for containers failed naming
// qemu-img.
func TestAutoPickedMicroVMThatFailsSaysWhy(t *testing.T) {
	store := t.TempDir()
	tdir := filepath.Join(store, "default", "v1")
	if err := os.MkdirAll(tdir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"vmlinux", "initramfs.cpio", "rootfs.ext4"} {
		if err := os.WriteFile(filepath.Join(tdir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m := `{"name":"default","version":"v1","kernel":{"file":"vmlinux"},"initramfs":{"file":"initramfs.cpio"},"rootfs":{"file":"rootfs.ext4"}}`
	if err := os.WriteFile(filepath.Join(tdir, guest.ManifestFile), []byte(m), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("v1", filepath.Join(store, "default", "current")); err != nil {
		t.Fatal(err)
	}
	// QEMU, but no qemu-img: microvm.New fails.
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "qemu-system-x86_64"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	f := &nodeFlags{driver: "auto", imageDir: store, data: t.TempDir(), accel: "auto", runtime: "runc", tcgCacheMB: 64, egress: egressFlags{mode: "off"}}
	d, err := newDriver(f)
	if err == nil {
		t.Fatalf("auto started %s without qemu-img", d.Name())
	}
	for _, want := range []string{"driver: auto: microvm, with QEMU and template default@v1 in " + store + ": ", "qemu-img"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q does not say %q", err, want)
		}
	}
}
