package microvm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/internal/atomicfile"
)

// Accelerator verdicts are cached in this file of the state directory,
// keyed by kernel and QEMU version: a probe costs a boot.
const accelCacheFile = "accel.json"

type accelVerdict struct {
	Kernel string `json:"kernel_sha256"`
	QEMU   string `json:"qemu_version"`
	Accel  string `json:"accelerator"`
	Reason string `json:"reason"`
}

// probeKVM boots t's kernel and initramfs under KVM in probe mode (no
// root disk; the guest prints guest.ProbeMarker and powers off) and
// reports whether the marker appeared in time. A KVM that exists but does
// not run a stock kernel (such as a PVM backend) fails here. definite
// says the answer is the host's and may be cached: not when the probe was
// interrupted or could not run (/dev/kvm not opened, QEMU not started),
// which the next probe may well get past.
func probeKVM(ctx context.Context, qemu string, t *guest.Template, dir string) (ok bool, why string, definite bool) {
	if !haveDevKVM() {
		return false, noDevKVM, true
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false, "/dev/kvm: " + err.Error(), false
	}
	f.Close()
	// QEMU starts under a shell that joins its cgroup and then execs it
	// (start), so a missing binary shows only as an early exit, which
	// would read as the host's verdict and be cached.
	if _, err := exec.LookPath(qemu); err != nil {
		return false, "QEMU not started: " + err.Error(), false
	}
	s := vmSpec{ID: "probe-" + randID(), Dir: filepath.Join(dir, "probe-"+randID()), Kernel: kernelPath(t, 1),
		Initramfs: t.Path(t.Initramfs), MemMB: 128, VCPUs: 1, Accel: "kvm", Cmdline: kernelCmdline("warren.probe=1")}
	defer os.RemoveAll(s.Dir)
	p, err := start(qemu, s, nil, nil, "")
	if err != nil {
		return false, err.Error(), false
	}
	defer p.kill()
	deadline := time.After(8 * time.Second)
	for {
		if b, _ := os.ReadFile(filepath.Join(s.Dir, "console.log")); strings.Contains(string(b), guest.ProbeMarker) {
			return true, "a probe boot under KVM printed its marker", true
		}
		select {
		case <-p.exited:
			if b, _ := os.ReadFile(filepath.Join(s.Dir, "console.log")); strings.Contains(string(b), guest.ProbeMarker) {
				return true, "a probe boot under KVM printed its marker", true
			}
			return false, "a probe boot under KVM exited without its marker: " + tail(filepath.Join(s.Dir, "qemu.log")), ctx.Err() == nil
		case <-deadline:
			return false, "a probe boot under KVM printed nothing in 8s (KVM here does not run a stock kernel)", ctx.Err() == nil
		case <-ctx.Done():
			return false, "the probe boot under KVM was interrupted: " + ctx.Err().Error(), false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// probe is probeKVM; tests replace it.
var probe = probeKVM

// noDevKVM is the verdict's reason when the host has no /dev/kvm.
const noDevKVM = "no /dev/kvm"

// haveDevKVM reports whether /dev/kvm exists; tests replace it.
var haveDevKVM = func() bool {
	_, err := os.Stat("/dev/kvm")
	return err == nil
}

// stillHolds reports whether a cached verdict agrees with /dev/kvm as it
// is now. Its presence changes without a new kernel or QEMU: a node that
// started before kvm_intel made it cached "no /dev/kvm", a store copied
// from a build host without KVM carries that verdict to KVM hosts, and a
// "kvm" verdict after /dev/kvm went away fails every boot. Either is
// probed again.
func (v accelVerdict) stillHolds(devKVM bool) bool {
	switch {
	case v.Accel == "kvm":
		return devKVM
	case v.Reason == noDevKVM:
		return !devKVM
	}
	return true
}

// chooseAccel returns "kvm" or "tcg" and why, probing once per kernel and
// QEMU version. The verdict is a property of the host, so it is cached in
// each of cacheDirs (the template store, shared by every node and build on
// the host, and the node's state directory); the probe runs in the last.
// A cached verdict holds only while /dev/kvm's presence agrees with it
// (stillHolds).
func chooseAccel(ctx context.Context, want, qemu, qver string, t *guest.Template, cacheDirs ...string) (string, string) {
	switch want {
	case "tcg":
		return "tcg", "set by configuration"
	case "kvm":
		return "kvm", "set by configuration"
	}
	devKVM := haveDevKVM()
	for _, dir := range cacheDirs {
		var v accelVerdict
		b, err := os.ReadFile(filepath.Join(dir, accelCacheFile))
		if err == nil && json.Unmarshal(b, &v) == nil && v.Kernel == kernelSHA256(t, 1) && v.QEMU == qver && v.stillHolds(devKVM) {
			return v.Accel, v.Reason + " (cached)"
		}
	}
	ok, why, definite := probe(ctx, qemu, t, cacheDirs[len(cacheDirs)-1])
	v := accelVerdict{Kernel: kernelSHA256(t, 1), QEMU: qver, Accel: "tcg", Reason: why}
	if ok {
		v.Accel = "kvm"
	}
	// A probe that was interrupted or could not run says nothing about
	// the host: cached, it would hold a KVM host on TCG for good.
	if !definite || ctx.Err() != nil {
		return v.Accel, v.Reason + " (not cached: the next start probes again)"
	}
	if b, err := json.Marshal(v); err == nil {
		for _, dir := range cacheDirs {
			_ = atomicfile.WriteFile(filepath.Join(dir, accelCacheFile), b, 0o644)
		}
	}
	return v.Accel, v.Reason
}

// kernelPath is the kernel file a guest of t with vcpus vCPUs boots.
func kernelPath(t *guest.Template, vcpus int) string {
	k, _ := t.KernelFor(vcpus)
	return t.Path(k)
}

// kernelSHA256 is the checksum of the kernel a guest of t with vcpus
// vCPUs boots.
func kernelSHA256(t *guest.Template, vcpus int) string {
	k, _ := t.KernelFor(vcpus)
	return k.SHA256
}

// SmokeBoot cold-boots t once with accel ("" probes) and returns the
// accelerator used and the time from QEMU's start to the agent's first
// answer to `uname -r`, with one vCPU. `warren image build` records both
// in the manifest. A template with a uniprocessor kernel is booted a
// second time, with 2 vCPUs on its other kernel, which must bring up both.
func SmokeBoot(ctx context.Context, qemu string, accel string, t *guest.Template, workDir string) (string, time.Duration, error) {
	qver, err := qemuVersion(qemu)
	if err != nil {
		return "", 0, err
	}
	if accel == "" || accel == "auto" {
		accel, _ = chooseAccel(ctx, "auto", qemu, qver, t, filepath.Dir(filepath.Dir(t.Dir)), workDir)
	}
	took, err := smokeBoot(ctx, qemu, accel, t, workDir, 1)
	if err != nil {
		return "", 0, err
	}
	if t.KernelUP != nil {
		if _, err := smokeBoot(ctx, qemu, accel, t, workDir, 2); err != nil {
			return "", 0, fmt.Errorf("with 2 vCPUs: %w", err)
		}
	}
	return accel, took, nil
}

// smokeBoot boots t with vcpus vCPUs and checks its kernel's release and
// the guest's CPU count.
func smokeBoot(ctx context.Context, qemu, accel string, t *guest.Template, workDir string, vcpus int) (time.Duration, error) {
	kernel, release := t.KernelFor(vcpus)
	dir := filepath.Join(workDir, "smoke-"+randID())
	defer os.RemoveAll(dir)
	disk := filepath.Join(dir, "disk.qcow2")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	if err := createOverlay(ctx, t.Path(t.Rootfs), "raw", disk); err != nil {
		return 0, err
	}
	s := vmSpec{ID: "smoke-" + randID(), Dir: dir, Kernel: t.Path(kernel), Initramfs: t.Path(t.Initramfs), Disk: disk,
		MemMB: 256, VCPUs: vcpus, Accel: accel, Cmdline: kernelCmdline("")}
	t0 := time.Now()
	p, err := start(qemu, s, nil, nil, "")
	if err != nil {
		return 0, err
	}
	defer p.kill()
	bctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c, err := waitAgent(bctx, s, p.exited, bootAgentWait, slog.Default())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	out, res, err := c.Output(bctx, "uname", "-r")
	if err != nil {
		return 0, err
	}
	took := time.Since(t0)
	if res.ExitCode != 0 || strings.TrimSpace(string(out)) != release {
		return 0, fmt.Errorf("uname -r: exit %d, %q; want %q", res.ExitCode, out, release)
	}
	out, res, err = c.Output(bctx, "nproc")
	if err != nil {
		return 0, err
	}
	if res.ExitCode != 0 || strings.TrimSpace(string(out)) != strconv.Itoa(vcpus) {
		return 0, fmt.Errorf("nproc: exit %d, %q; want %d CPUs", res.ExitCode, out, vcpus)
	}
	return took, nil
}

func randID() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
