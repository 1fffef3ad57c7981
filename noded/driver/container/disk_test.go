package container

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/internal/testenv"
	"github.com/warrenhq/warren/noded/driver"
)

// A relative state directory (`warren dev`'s default data dir is
// .warren/dev) works: claims used to fail (runc takes no relative root),
// and their cleanup left the box's overlay, disk mount and loop device,
// since mountinfo names mount points by absolute path.
func TestRelativeStateDirLeavesNothing(t *testing.T) {
	d0 := newDriver(t) // skips without containerd, runc or the template
	cfg := d0.cfg
	d0.Close()
	base := t.TempDir()
	t.Chdir(base)
	cfg.StateDir = "rel/container"
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-rel"})
	if err != nil {
		t.Fatalf("claim with a relative state dir: %v", err)
	}
	if out, code := run(t, sb, "echo ok"); code != 0 || out != "ok\n" {
		t.Fatalf("exit %d %q", code, out)
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	abs := filepath.Join(base, "rel/container/boxes/sb-rel")
	for _, m := range []string{filepath.Join(abs, "rootfs"), filepath.Join(abs, diskMount)} {
		if isMounted(m) {
			t.Errorf("%s is still mounted", m)
			_ = os.Remove(m) // fails while mounted; the unmount below frees it
		}
	}
	waitNoLoops(t, abs)
	if _, err := os.Stat(abs); !os.IsNotExist(err) {
		t.Errorf("box directory left: %v", err)
	}
}

// Blank disk images are kept for at most maxBlanks sizes (each distinct
// disk_mb made one, and all were kept until the next start), and one
// removed from outside is made again rather than failing its size's claims.
func TestBlankDisksAreBounded(t *testing.T) {
	d := newDriver(t)
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mustTemplateDirLoaded(t, d)
	u, err := used(lowerMountOf(t, d))
	if err != nil {
		t.Fatal(err)
	}
	base := int(u>>20) + 64
	blanks := func() []string {
		ents, _ := os.ReadDir(filepath.Join(d.cfg.StateDir, "blank"))
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	for i := 0; i < maxBlanks+2; i++ {
		sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-blank", Limits: driver.Limits{DiskMB: base + i}})
		if err != nil {
			t.Fatal(err)
		}
		sb.Destroy()
	}
	if got := blanks(); len(got) != maxBlanks {
		t.Errorf("blank images after %d sizes: %v, want %d", maxBlanks+2, got, maxBlanks)
	}
	for _, b := range blanks() {
		if err := os.Remove(filepath.Join(d.cfg.StateDir, "blank", b)); err != nil {
			t.Fatal(err)
		}
	}
	sb, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-blank", Limits: driver.Limits{DiskMB: base + maxBlanks + 1}})
	if err != nil {
		t.Fatalf("a claim after its blank was removed: %v", err)
	}
	sb.Destroy()
}

// mustTemplateDirLoaded returns the default template's dir with its lower
// mounted (a claim made first mounts it).
func mustTemplateDirLoaded(t *testing.T, d *Driver) string {
	t.Helper()
	sb, err := d.Claim(context.Background(), driver.ClaimRequest{ID: "sb-lower"})
	if err != nil {
		t.Fatal(err)
	}
	sb.Destroy()
	return mustTemplateDir(t)
}

// Without mkfs.ext4 the driver does not start, and says what is missing,
// rather than fail every claim.
func TestNewNeedsMkfs(t *testing.T) {
	d0 := newDriver(t)
	cfg := d0.cfg
	d0.Close()
	t.Setenv("PATH", t.TempDir())
	_, err := New(cfg)
	if err == nil || !strings.Contains(err.Error(), "mkfs.ext4") || !strings.Contains(err.Error(), "e2fsprogs") {
		t.Fatalf("New without mkfs.ext4: %v", err)
	}
}

// isMounted finds a mount point whose path /proc/self/mountinfo escapes (a
// space is written \040), and one given by a relative path.
func TestIsMountedEscapedAndRelativePaths(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root to mount")
	}
	base := t.TempDir()
	dir := filepath.Join(base, "my dir")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if isMounted(dir) {
		t.Fatalf("%s is mounted before the mount", dir)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	mounted := true
	defer func() {
		if mounted {
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
	}()
	if !isMounted(dir) {
		t.Errorf("%s: not found mounted (mountinfo writes it escaped)", dir)
	}
	t.Chdir(base)
	if !isMounted("my dir") {
		t.Error(`"my dir" (relative): not found mounted`)
	}
	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatal(err)
	}
	mounted = false
	if isMounted(dir) {
		t.Errorf("%s is mounted after the unmount", dir)
	}
}

// templateStore makes an image store of the given templates (each a name
// and a version), all of the real default template's files, and returns
// it and a function that points a template's current at a version.
func templateStore(t *testing.T, tpls ...[2]string) (string, func(name, version string)) {
	t.Helper()
	src, err := guest.LoadTemplate(imageDir(), "default")
	if err != nil {
		t.Fatal(err)
	}
	store := t.TempDir()
	for _, nv := range tpls {
		dir := filepath.Join(store, nv[0], nv[1])
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, a := range src.Artifacts() {
			if err := os.Symlink(src.Path(a), filepath.Join(dir, a.File)); err != nil {
				t.Fatal(err)
			}
		}
		m := src.Manifest
		m.Name, m.Version = nv[0], nv[1]
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, guest.ManifestFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return store, func(name, version string) {
		cur := filepath.Join(store, name, "current")
		_ = os.Remove(cur)
		if err := os.Symlink(version, cur); err != nil {
			t.Fatal(err)
		}
	}
}

// storeDriver is a driver on the image store, with a state dir of its own.
func storeDriver(t *testing.T, store string) *Driver {
	t.Helper()
	d0 := newDriver(t) // checks the prerequisites
	cfg := d0.cfg
	d0.Close()
	cfg.ImageDir, cfg.StateDir = store, t.TempDir()
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// A template version's read-only mount goes once no box uses it and a
// newer version is in use. Before, every version a node ever used stayed
// mounted until it restarted, each holding a loop device and the disk
// space of an image the build's --keep had deleted.
func TestAnOldTemplateVersionIsUnmountedOnceUnused(t *testing.T) {
	store, use := templateStore(t, [2]string{"default", "va"}, [2]string{"default", "vb"})
	use("default", "va")
	d := storeDriver(t, store)
	defer d.Close()
	ctx := context.Background()
	a, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-va"})
	if err != nil {
		t.Fatal(err)
	}
	va := filepath.Join(d.cfg.StateDir, "lower", "default@va")
	use("default", "vb")
	b, err := d.Claim(ctx, driver.ClaimRequest{ID: "sb-vb"})
	if err != nil {
		t.Fatal(err)
	}
	if !isMounted(va) {
		t.Fatal("version va was unmounted while a box used it")
	}
	if out, code := run(t, a, "cat /etc/os-release >/dev/null && echo ok"); code != 0 || out != "ok\n" {
		t.Fatalf("the box on va after vb was mounted: exit %d %q", code, out)
	}
	if err := a.Destroy(); err != nil {
		t.Fatal(err)
	}
	if isMounted(va) {
		t.Error("version va is still mounted with no box using it and vb current")
	}
	vb := filepath.Join(d.cfg.StateDir, "lower", "default@vb")
	if err := b.Destroy(); err != nil {
		t.Fatal(err)
	}
	if !isMounted(vb) {
		t.Error("the current version vb was unmounted: the next claim would mount it again")
	}
}

// Each template keeps its current version mounted, whatever the others
// do: claims of two templates in turn do not unmount each other's. And
// two templates whose name and version join alike (a-b at c, a at b-c)
// get mounts of their own.
func TestTemplatesKeepTheirOwnLowerMounts(t *testing.T) {
	store, use := templateStore(t, [2]string{"default", "v1"}, [2]string{"a-b", "c"}, [2]string{"a", "b-c"})
	use("default", "v1") // the driver's default
	use("a-b", "c")
	use("a", "b-c")
	d := storeDriver(t, store)
	defer d.Close()
	ctx := context.Background()
	mounts := map[string]string{}
	for i, name := range []string{"a-b", "a", "a-b"} {
		sb, err := d.Claim(ctx, driver.ClaimRequest{ID: fmt.Sprintf("sb-tpl-%d", i), Template: name})
		if err != nil {
			t.Fatal(err)
		}
		mounts[name] = sb.(*Box).lower
		if got := sb.(*Box).Info().Template; !strings.HasPrefix(got, name+"@") {
			t.Errorf("a claim of %s runs %s", name, got)
		}
		if err := sb.Destroy(); err != nil {
			t.Fatal(err)
		}
	}
	if mounts["a-b"] == mounts["a"] {
		t.Errorf("templates a-b@c and a@b-c share the mount %s", mounts["a"])
	}
	for name, m := range mounts {
		if !isMounted(m) {
			t.Errorf("template %s's current version (%s) was unmounted by another template's claim", name, m)
		}
	}
}
