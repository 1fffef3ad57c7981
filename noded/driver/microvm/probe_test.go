package microvm

import (
	"context"
	"encoding/json"
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
	defer func(h func() bool) { haveDevKVM = h }(haveDevKVM)
	for _, c := range []struct {
		name      string
		devKVM    bool // whether /dev/kvm exists, as the verdict found
		ok        bool
		definite  bool
		cancelled bool
		want      string
		cached    bool
	}{
		{"no /dev/kvm", false, false, true, false, "tcg", true},
		{"marker seen", true, true, true, false, "kvm", true},
		{"no marker in time", true, false, true, false, "tcg", true},
		{"QEMU did not start", true, false, false, false, "tcg", false},
		{"interrupted", true, false, false, true, "tcg", false},
		{"no marker, but the context ended meanwhile", true, false, true, true, "tcg", false},
	} {
		store, state := t.TempDir(), t.TempDir()
		haveDevKVM = func() bool { return c.devKVM }
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

// A cached verdict holds only while /dev/kvm's presence agrees with it.
// Before, "no /dev/kvm" cached by a node that started before kvm_intel
// made it (or in a store copied from a build host without KVM) kept KVM
// hosts on TCG for good, and a "kvm" cached before /dev/kvm went away
// failed every boot.
func TestCachedAccelVerdictFollowsDevKVM(t *testing.T) {
	tpl := &guest.Template{Manifest: guest.Manifest{Kernel: guest.Artifact{File: "vmlinux", SHA256: "k"}}}
	defer func(p func(context.Context, string, *guest.Template, string) (bool, string, bool)) { probe = p }(probe)
	defer func(h func() bool) { haveDevKVM = h }(haveDevKVM)
	for _, c := range []struct {
		name    string
		cached  accelVerdict
		inStore bool // the verdict is in the template store's cache, else the node's
		devKVM  bool
		probed  bool // the probe runs again
		want    string
		wantWhy string
	}{
		{"no /dev/kvm cached, /dev/kvm there now", accelVerdict{Accel: "tcg", Reason: noDevKVM}, false, true, true, "kvm", "probe: marker"},
		{"no /dev/kvm in a store from a host without KVM", accelVerdict{Accel: "tcg", Reason: noDevKVM}, true, true, true, "kvm", "probe: marker"},
		{"kvm cached, /dev/kvm gone", accelVerdict{Accel: "kvm", Reason: "a probe boot under KVM printed its marker"}, false, false, true, "tcg", noDevKVM},
		{"kvm cached, /dev/kvm there", accelVerdict{Accel: "kvm", Reason: "a probe boot under KVM printed its marker"}, true, true, false, "kvm", "a probe boot under KVM printed its marker (cached)"},
		{"no /dev/kvm cached, still none", accelVerdict{Accel: "tcg", Reason: noDevKVM}, false, false, false, "tcg", noDevKVM + " (cached)"},
		{"no marker cached, /dev/kvm there", accelVerdict{Accel: "tcg", Reason: "no marker in 8s"}, true, true, false, "tcg", "no marker in 8s (cached)"},
	} {
		store, state := t.TempDir(), t.TempDir()
		v := c.cached
		v.Kernel, v.QEMU = "k", "7.2.0"
		b, _ := json.Marshal(v)
		dir := state
		if c.inStore {
			dir = store
		}
		if err := os.WriteFile(filepath.Join(dir, accelCacheFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		haveDevKVM = func() bool { return c.devKVM }
		probed := false
		probe = func(context.Context, string, *guest.Template, string) (bool, string, bool) {
			probed = true
			if !c.devKVM {
				return false, noDevKVM, true
			}
			return true, "probe: marker", true
		}
		accel, why := chooseAccel(context.Background(), "auto", "qemu", "7.2.0", tpl, store, state)
		if accel != c.want || why != c.wantWhy || probed != c.probed {
			t.Errorf("%s: chose %s (%s), probed %v; want %s (%s), probed %v", c.name, accel, why, probed, c.want, c.wantWhy, c.probed)
		}
		if !c.probed {
			continue
		}
		// The new verdict replaced the stale one in both caches.
		for _, dir := range []string{store, state} {
			var got accelVerdict
			b, err := os.ReadFile(filepath.Join(dir, accelCacheFile))
			if err != nil || json.Unmarshal(b, &got) != nil || got.Accel != c.want {
				t.Errorf("%s: cache in %s after the probe: %s (%v), want %s", c.name, dir, b, err, c.want)
			}
		}
	}
}
