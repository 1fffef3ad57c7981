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

// A template reference (NAME@VERSION) and a manifest's artifacts cannot
// reach outside the template store.
func TestTemplateStaysInItsStore(t *testing.T) {
	tmp := t.TempDir()
	root := filepath.Join(tmp, "store")
	outside := filepath.Join(tmp, "elsewhere")
	for _, d := range []string{filepath.Join(root, "default"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"k", "i", "r", "a"} {
		if err := os.WriteFile(filepath.Join(outside, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bad := `{"name":"evil","version":"1","kernel":{"file":"k","size":1},"initramfs":{"file":"i","size":1},"rootfs":{"file":"r","size":1},"agent":{"file":"a","size":1}}`
	if err := os.WriteFile(filepath.Join(outside, ManifestFile), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"default@../../elsewhere", "default@..", "default@/abs", "../elsewhere", "default@.hidden"} {
		if tpl, err := LoadTemplate(root, ref); err == nil {
			t.Errorf("template %q loaded from %s, outside the store %s", ref, tpl.Dir, root)
		}
	}
	// A manifest whose artifact names a file outside its directory.
	in := filepath.Join(root, "default", "v1")
	if err := os.MkdirAll(in, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"k", "i", "r"} {
		if err := os.WriteFile(filepath.Join(in, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, file := range []string{"../../elsewhere/r", "/etc/hostname"} {
		m := `{"name":"default","version":"v1","kernel":{"file":"k","size":1},"initramfs":{"file":"i","size":1},"rootfs":{"file":"` + file + `","size":1}}`
		if err := os.WriteFile(filepath.Join(in, ManifestFile), []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadTemplate(root, "default@v1"); err == nil || !strings.Contains(err.Error(), "not a file name") {
			t.Errorf("rootfs %q: %v", file, err)
		}
	}
	m := `{"name":"default","version":"v1","kernel":{"file":"k","size":1},"initramfs":{"file":"i","size":1},"rootfs":{"file":"r","size":1}}`
	if err := os.WriteFile(filepath.Join(in, ManifestFile), []byte(m), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTemplate(root, "default@v1"); err != nil {
		t.Errorf("a good template: %v", err)
	}
}
