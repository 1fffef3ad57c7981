package microvm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/guest"
)

// Only a definite verdict is cached: a probe that was interrupted or
// could not run would otherwise hold a KVM host on TCG for good.
func TestChooseAccelCachesOnlyDefiniteVerdicts(t *testing.T) {
	tpl := &guest.Template{Manifest: guest.Manifest{Kernel: guest.Artifact{File: "vmlinux", SHA256: "k"}}}
	defer func(p func(context.Context, string, *guest.Template, string) (bool, string, bool)) { probe = p }(probe)
	for _, c := range []struct {
		name      string
		ok        bool
		definite  bool
		cancelled bool
		want      string
		cached    bool
	}{
		{"no /dev/kvm", false, true, false, "tcg", true},
		{"marker seen", true, true, false, "kvm", true},
		{"no marker in time", false, true, false, "tcg", true},
		{"QEMU did not start", false, false, false, "tcg", false},
		{"interrupted", false, false, true, "tcg", false},
		{"no marker, but the context ended meanwhile", false, true, true, "tcg", false},
	} {
		store, state := t.TempDir(), t.TempDir()
		probe = func(context.Context, string, *guest.Template, string) (bool, string, bool) {
			return c.ok, c.name, c.definite
		}
		ctx, cancel := context.WithCancel(context.Background())
		if c.cancelled {
			cancel()
		}
		accel, why := chooseAccel(ctx, "auto", "qemu", "7.2.0", tpl, store, state)
		cancel()
		if accel != c.want || !strings.HasPrefix(why, c.name) {
			t.Errorf("%s: chose %s (%s), want %s", c.name, accel, why, c.want)
		}
		for _, dir := range []string{store, state} {
			if _, err := os.Stat(filepath.Join(dir, accelCacheFile)); (err == nil) != c.cached {
				t.Errorf("%s: cached in %s: %v, want %v", c.name, dir, err == nil, c.cached)
			}
		}
		if c.cached {
			probe = nil // a second choice reads the cache
			if again, why := chooseAccel(context.Background(), "auto", "qemu", "7.2.0", tpl, store, state); again != accel || !strings.HasSuffix(why, "(cached)") {
				t.Errorf("%s: second choice %s (%s)", c.name, again, why)
			}
		}
	}
}

// probeKVM's own verdicts: without /dev/kvm a definite no; with it, a
// QEMU that does not start says nothing about the host.
func TestProbeKVMWithoutAStartedQEMUIsNotDefinite(t *testing.T) {
	tpl := &guest.Template{Dir: t.TempDir(), Manifest: guest.Manifest{Kernel: guest.Artifact{File: "vmlinux"}, Initramfs: guest.Artifact{File: "initramfs.cpio"}}}
	ok, why, definite := probeKVM(context.Background(), filepath.Join(t.TempDir(), "no-qemu"), tpl, t.TempDir())
	if _, err := os.Stat("/dev/kvm"); err != nil {
		if ok || why != "no /dev/kvm" || !definite {
			t.Errorf("without /dev/kvm: %v, %q, definite %v", ok, why, definite)
		}
		return
	}
	if ok || definite {
		t.Errorf("with /dev/kvm and no QEMU: %v, %q, definite %v", ok, why, definite)
	}
}
