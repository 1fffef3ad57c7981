package guest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeTemplate writes a template store with one version of "default",
// whose artifacts are small files, and returns the store's root.
func writeTemplate(t *testing.T, withUP bool) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "default", "v1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m := Manifest{Name: "default", Version: "v1", KernelRelease: "6.1.192-warren"}
	files := []struct {
		dst  *Artifact
		name string
	}{{&m.Kernel, "vmlinux"}, {&m.Initramfs, "initramfs.cpio"}, {&m.Rootfs, "rootfs.ext4"}}
	if withUP {
		m.KernelUP, m.KernelUPRelease = &Artifact{}, "6.1.192-warren-up"
		files = append(files, struct {
			dst  *Artifact
			name string
		}{m.KernelUP, "vmlinux-up"})
	}
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if err := os.WriteFile(p, []byte("contents of "+f.name), 0o644); err != nil {
			t.Fatal(err)
		}
		sum, n, err := FileSHA256(p)
		if err != nil {
			t.Fatal(err)
		}
		*f.dst = Artifact{File: f.name, SHA256: sum, Size: n}
	}
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(dir, ManifestFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("v1", filepath.Join(root, "default", "current")); err != nil {
		t.Fatal(err)
	}
	return root
}

// A template with a uniprocessor kernel gives it to one-vCPU guests and
// its other kernel to the rest; one without gives its kernel to all. The
// uniprocessor kernel is checked on load and verified like the others.
func TestKernelFor(t *testing.T) {
	for _, withUP := range []bool{false, true} {
		root := writeTemplate(t, withUP)
		tpl, err := LoadTemplate(root, "default")
		if err != nil {
			t.Fatal(err)
		}
		if err := tpl.Verify(); err != nil {
			t.Fatal(err)
		}
		k1, r1 := tpl.KernelFor(1)
		k2, r2 := tpl.KernelFor(2)
		want1, wantR1 := "vmlinux", "6.1.192-warren"
		if withUP {
			want1, wantR1 = "vmlinux-up", "6.1.192-warren-up"
		}
		if k1.File != want1 || r1 != wantR1 || k2.File != "vmlinux" || r2 != "6.1.192-warren" {
			t.Errorf("with up %v: 1 vCPU %s %s, 2 vCPUs %s %s", withUP, k1.File, r1, k2.File, r2)
		}
		if n := len(tpl.Artifacts()); n != map[bool]int{false: 3, true: 4}[withUP] {
			t.Errorf("with up %v: %d artifacts", withUP, n)
		}
		if !withUP {
			continue
		}
		up := filepath.Join(tpl.Dir, "vmlinux-up")
		os.WriteFile(up, []byte("contents of vmlinux-uP"), 0o644) // same size, other bytes
		if err := tpl.Verify(); err == nil || !strings.Contains(err.Error(), "vmlinux-up") {
			t.Errorf("Verify of a changed vmlinux-up: %v", err)
		}
		os.Remove(up)
		if _, err := LoadTemplate(root, "default"); err == nil || !strings.Contains(err.Error(), "vmlinux-up") {
			t.Errorf("LoadTemplate without vmlinux-up: %v", err)
		}
	}
}
