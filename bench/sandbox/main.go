// Command sandbox measures the microvm driver on this machine, in one
// process, through the same driver a node uses:
//
//   - cold boot: a claim that boots the template from scratch, to the
//     first command answered;
//   - snapshot restore (a cold claim): a claim that restores a clone of the
//     template's snapshot, to the first command answered; alternately onto
//     one of the driver's standby QEMUs (launched ahead, waiting to load the
//     snapshot) and with QEMU's start on the claim's path (no standby, as
//     for the claims of a burst after the standbys), each after the same
//     idle;
//   - warm-pool claim: a claim served from a warm pool, to the first
//     command answered (the pool is refilled and idle before each claim);
//   - the peer: a containerd + runc container start, timed as the whole
//     `ctr run --rm --rootfs ROOTFS ID /bin/true` process (containerd is
//     started for the run if none runs), and warren's own container driver
//     (claim → first command) when a containerd runs;
//   - PSS and CPU per idle sandbox with 10 and with 50 restored sandboxes running
//     (the sum of the QEMU processes' Pss from /proc/PID/smaps_rollup,
//     divided by their count), and the PSS of one idle standby QEMU.
//
// The first command is `/bin/true` run through the agent. It needs root,
// QEMU and a template (`make image`). Run from the repository root:
//
//	go run ./bench/sandbox -out bench/results/sandbox.md
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/netpolicy"
	"github.com/warrenhq/warren/noded"
	"github.com/warrenhq/warren/noded/driver"
	"github.com/warrenhq/warren/noded/driver/container"
	"github.com/warrenhq/warren/noded/driver/microvm"
)

type config struct {
	imageDir, stateDir, accel, out string
	boots, restores, warms, ctrs   int
	each                           bool
	tcgCache                       int
	tcgHugePages                   bool
	tcgASLR                        bool
	tcgGuestLSM                    bool
	tcgTicklessIdle                bool
	tcgRDRAND                      bool
	pss                            []int
	ctrSocket, rootfs, agent       string
	egress                         string
}

func main() {
	var c config
	var pss string
	flag.StringVar(&c.imageDir, "image-dir", "", "template store (default $WARREN_IMAGE_DIR or "+microvm.DefaultImageDir+")")
	flag.StringVar(&c.stateDir, "state", "", "state directory (default: a temporary one)")
	flag.StringVar(&c.accel, "accel", "auto", "auto, kvm or tcg")
	flag.IntVar(&c.tcgCache, "tcg-cache-mb", 0, "TCG translation cache per VM in MiB (0: the driver's default)")
	flag.BoolVar(&c.tcgHugePages, "tcg-huge-pages", false, "keep transparent huge pages for clones' QEMUs under TCG (the driver turns them off for clones by default; cold boots keep them)")
	flag.BoolVar(&c.tcgTicklessIdle, "tcg-tickless-idle", true, "under TCG, where the host's TSC is reliable, let guests stop their tick while idle (=false: the driver's TCGPeriodicTick)")
	flag.BoolVar(&c.tcgRDRAND, "tcg-rdrand", true, "under TCG, give guests RDRAND (=false: the driver's TCGNoRDRAND, QEMU's plain qemu64)")
	flag.BoolVar(&c.tcgGuestLSM, "tcg-guest-lsm", false, "keep the guest kernel's default security modules and pressure stall accounting under TCG (the driver boots guests with lsm=landlock,lockdown,yama psi=0 by default)")
	flag.BoolVar(&c.tcgASLR, "tcg-aslr", false, "keep address-space layout randomization in guests under TCG (the driver boots them with norandmaps by default)")
	flag.IntVar(&c.boots, "boots", 5, "cold boots")
	flag.IntVar(&c.restores, "restores", 20, "snapshot restores")
	flag.IntVar(&c.warms, "warm", 20, "warm-pool claims")
	flag.BoolVar(&c.each, "each", false, "print each claim's time and phases as it ends")
	flag.IntVar(&c.ctrs, "containers", 20, "container starts (0 skips the peer)")
	flag.StringVar(&pss, "pss", "10,50", "sandbox counts to measure idle PSS at")
	flag.StringVar(&c.ctrSocket, "containerd", "", "containerd socket for the peer and warren's container driver (default: the system's if it runs, else start a private one for the peer only)")
	flag.StringVar(&c.agent, "agent", "bin/warren-guest", "warren-guest binary for the container driver")
	flag.StringVar(&c.rootfs, "rootfs", "", "container root file system (default: the template's debootstrap tree)")
	flag.StringVar(&c.out, "out", "", "also write the report (markdown) here")
	flag.StringVar(&c.egress, "egress", "auto", "give each sandbox its egress-policy network, as a node does: on, off, or auto (on with /dev/net/tun, as `warren node --egress auto`); with it, a claim binds the sandbox's network in the guest")
	flag.Parse()
	for _, f := range strings.Split(pss, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 500 {
			fatal(fmt.Errorf("-pss: %q: want counts between 1 and 500", f))
		}
		c.pss = append(c.pss, n)
	}
	if c.imageDir == "" {
		c.imageDir = os.Getenv("WARREN_IMAGE_DIR")
	}
	if c.imageDir == "" {
		c.imageDir = microvm.DefaultImageDir
	}
	switch c.egress {
	case "auto":
		c.egress = "off"
		if _, err := os.Stat("/dev/net/tun"); err == nil {
			c.egress = "on"
		}
	case "on", "off":
	default:
		fatal(fmt.Errorf("-egress: %q is not on, off or auto", c.egress))
	}
	if c.ctrSocket == "" {
		if _, err := os.Stat(container.DefaultSocket); err == nil {
			c.ctrSocket = container.DefaultSocket
		}
	}
	if err := run(c); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench/sandbox:", err)
	os.Exit(1)
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "sandbox bench: "+format+"\n", args...)
}

type series struct {
	name, goal string
	goalMS     float64
	samples    []time.Duration
	// phases: per claim, where the time went (microVM claims only).
	phases []phases
}

// phases splits one claim → first command: the driver's claim phases, then
// the first command's round trip.
type phases struct {
	microvm.ClaimPhases
	First time.Duration
	// InGuest: the first command in the agent, from its start to its
	// exit status (the rest of First is the channel and the agent's call
	// handling).
	InGuest time.Duration
}

// median is the median of one phase over a series' claims.
func median(ps []phases, f func(phases) time.Duration) time.Duration {
	s := &series{}
	for _, p := range ps {
		s.samples = append(s.samples, f(p))
	}
	return s.pct(0.5)
}

func (s *series) pct(p float64) time.Duration {
	x := slices.Clone(s.samples)
	slices.Sort(x)
	if len(x) == 0 {
		return 0
	}
	// Nearest rank: the smallest sample with at least p of them at or
	// below it (p99 of 20 samples is the largest).
	i := int(math.Ceil(p*float64(len(x)))) - 1
	return x[max(i, 0)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func run(c config) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (cgroups)")
	}
	t, err := guest.LoadTemplate(c.imageDir, "default")
	if err != nil {
		return fmt.Errorf("%w (run `make image`)", err)
	}
	if c.stateDir == "" {
		if c.stateDir, err = os.MkdirTemp("", "warren-sbbench-"); err != nil {
			return err
		}
		defer os.RemoveAll(c.stateDir)
	}
	var nets driver.Networks
	if c.egress == "on" {
		// The node's default egress setup (namespaces kept ready, the DNS
		// resolver, the nftables table), with a tag of its own. No
		// sandbox here sends traffic.
		eg, err := noded.NewEgress(netpolicy.Config{Tag: "sbb", Pool: 4, StateDir: filepath.Join(c.stateDir, "egress")})
		if err != nil {
			return fmt.Errorf("egress (-egress off runs without): %w", err)
		}
		defer eg.Close()
		nets = eg
	}
	d, err := microvm.New(microvm.Config{ImageDir: c.imageDir, StateDir: c.stateDir, Accel: c.accel, TCGCacheMB: c.tcgCache, TCGHugePages: c.tcgHugePages, TCGASLR: c.tcgASLR, TCGGuestLSM: c.tcgGuestLSM, TCGPeriodicTick: !c.tcgTicklessIdle, TCGNoRDRAND: !c.tcgRDRAND,
		Networks: nets, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer d.Close()
	ctx := context.Background()
	progress("template %s@%s, accelerator %s (%s)", t.Name, t.Version, d.Accelerator(), d.AcceleratorReason())
	progress("making the template's snapshot")
	t0 := time.Now()
	if err := d.EnsureSnapshot(ctx, ""); err != nil {
		return err
	}
	snapTook := time.Since(t0)

	n := 0
	claim := func(force driver.Start, into *series) (driver.Start, error) {
		n++
		ctx, cancel := context.WithTimeout(ctx, 3*time.Minute) // a stuck claim fails the run
		defer cancel()
		t0 := time.Now()
		sb, err := d.Claim(ctx, driver.ClaimRequest{ID: fmt.Sprintf("bench-%d", n), Force: force})
		if err != nil {
			return "", err
		}
		defer sb.Destroy()
		ia := sb.(driver.Interactive)
		t1 := time.Now()
		res, err := ia.Run(ctx, guest.ExecRequest{Argv: []string{"/bin/true"}}, nil, nil)
		took := time.Since(t0)
		if err != nil {
			return "", err
		}
		if res.ExitCode != 0 {
			return "", fmt.Errorf("/bin/true exited %d", res.ExitCode)
		}
		into.samples = append(into.samples, took)
		if vm, ok := sb.(*microvm.VM); ok {
			p := phases{ClaimPhases: vm.ClaimPhases(), First: time.Since(t1), InGuest: res.Duration}
			into.phases = append(into.phases, p)
			if c.each {
				progress("%s %d: %v (resume %v, bind %v, first command %v, in the guest %v)", strings.SplitN(into.name, " (", 2)[0], len(into.samples),
					took.Round(10*time.Microsecond), p.Resume.Round(10*time.Microsecond), p.Bind.Round(10*time.Microsecond), p.First.Round(10*time.Microsecond), p.InGuest.Round(10*time.Microsecond))
			}
		}
		return ia.Info().Start, nil
	}
	boot := &series{name: "cold boot (claim → first command)"}
	restore := &series{name: "snapshot restore, a cold claim, onto a standby QEMU (claim → first command)", goal: "p50 ≤ 250 ms", goalMS: 250}
	burst := &series{name: "snapshot restore, a cold claim, QEMU started by the claim: no standby (claim → first command)", goal: "p50 ≤ 250 ms", goalMS: 250}
	warm := &series{name: "warm-pool claim (claim → first command)", goal: "p50 ≤ 15 ms", goalMS: 15}
	for i := 0; i < c.boots; i++ {
		start, err := claim(driver.StartBoot, boot)
		if err != nil {
			return fmt.Errorf("cold boot: %w", err)
		}
		if start != driver.StartBoot {
			return fmt.Errorf("cold boot: the sandbox started %q", start)
		}
		progress("cold boot %d/%d: %v", i+1, c.boots, boot.samples[len(boot.samples)-1].Round(time.Millisecond))
	}
	// Alternating, one claim of each kind in turn, each after the same
	// idle: onto a standby QEMU (the driver's default), then with no
	// standby, so the claim starts its own QEMU. (Back to back runs of
	// each kind drifted apart with the host's speed.)
	restoreOne := func(s *series, standby bool) error {
		want := 0
		if standby {
			want = 1
		}
		d.SetStandbyQEMUs(want)
		if standby {
			if err := waitStandby(d, 1); err != nil {
				return err
			}
		}
		time.Sleep(300 * time.Millisecond) // as before a warm claim
		start, err := claim(driver.StartRestore, s)
		if err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		if start != driver.StartRestore {
			return fmt.Errorf("restore: the sandbox started %q", start)
		}
		if got := s.phases[len(s.phases)-1].Standby; got != standby {
			return fmt.Errorf("restore: onto a standby QEMU %v, want %v", got, standby)
		}
		return nil
	}
	for i := 0; i < c.restores; i++ {
		if err := restoreOne(restore, true); err != nil {
			return err
		}
		if err := restoreOne(burst, false); err != nil {
			return err
		}
	}
	progress("restores onto a standby QEMU: p50 %v; with QEMU's start: p50 %v", restore.pct(0.5).Round(time.Millisecond), burst.pct(0.5).Round(time.Millisecond))
	d.SetStandbyQEMUs(1)
	// One idle standby QEMU's memory, alone on the host.
	var standbyPSS, standbyRSS, standbyAnon int64
	if c.restores > 0 {
		if err := waitStandby(d, 1); err != nil {
			return err
		}
		time.Sleep(time.Second)
		var procs int
		if standbyPSS, standbyRSS, standbyAnon, procs = qemuMemory(); procs != 1 {
			return fmt.Errorf("standby PSS: found %d QEMU processes, want 1", procs)
		}
		progress("an idle standby QEMU: PSS %.1f MiB, %.1f MiB of it anonymous", float64(standbyPSS)/1024, float64(standbyAnon)/1024)
	}
	d.SetPoolTarget("default", 1)
	for i := 0; i < c.warms; i++ {
		if err := waitPool(d, 1); err != nil {
			return err
		}
		time.Sleep(300 * time.Millisecond) // the refill's QEMU settles
		start, err := claim("", warm)
		if err != nil {
			return fmt.Errorf("warm claim: %w", err)
		}
		if start != driver.StartWarm {
			return fmt.Errorf("warm claim: the sandbox started %q", start)
		}
	}
	d.SetPoolTarget("default", 0)
	d.SetStandbyQEMUs(0) // the idle sandboxes below are measured alone
	progress("warm claims: p50 %v", warm.pct(0.5).Round(time.Millisecond))

	all := []*series{boot, restore, burst, warm}
	if c.ctrs > 0 && c.ctrSocket != "" {
		// warren's own container driver, claim to first command, beside the
		// bare ctr figure.
		cd, err := container.New(container.Config{Socket: c.ctrSocket, ImageDir: c.imageDir, StateDir: filepath.Join(c.stateDir, "container"),
			Namespace: "warren-bench", Agent: c.agent, Networks: nets})
		if err != nil {
			progress("container driver: %v", err)
		} else {
			s := &series{name: "warren container driver (claim → first command)"}
			for i := 0; i < c.ctrs; i++ {
				n++
				t0 := time.Now()
				sb, err := cd.Claim(ctx, driver.ClaimRequest{ID: fmt.Sprintf("ctr-%d", n)})
				if err != nil {
					cd.Close()
					return fmt.Errorf("container driver: %w", err)
				}
				_, err = sb.(driver.Interactive).Run(ctx, guest.ExecRequest{Argv: []string{"/bin/true"}}, nil, nil)
				took := time.Since(t0)
				sb.Destroy()
				if err != nil {
					cd.Close()
					return fmt.Errorf("container driver: %w", err)
				}
				s.samples = append(s.samples, took)
			}
			cd.Close()
			progress("container driver: p50 %v", s.pct(0.5).Round(time.Millisecond))
			all = append(all, s)
		}
	}
	var ctrNote string
	if c.ctrs > 0 {
		ctr := &series{name: "peer: containerd + runc start (`ctr run --rm`, whole process)"}
		ctrNote, err = containers(c, ctr)
		if err != nil {
			ctrNote = "not measured: " + err.Error()
			progress("containers: %v", err)
		} else {
			all = append(all, ctr)
		}
	}

	type pssRow struct {
		n           int
		perMiB, rss float64
		cpu         float64 // % of one core per idle sandbox
	}
	var pssRows []pssRow
	for _, count := range c.pss {
		var sbs []driver.Sandbox
		for i := 0; i < count; i++ {
			n++
			sb, err := d.Claim(ctx, driver.ClaimRequest{ID: fmt.Sprintf("pss-%d", n), Force: driver.StartRestore})
			if err != nil {
				for _, s := range sbs {
					s.Destroy()
				}
				return fmt.Errorf("pss with %d: %w", count, err)
			}
			sbs = append(sbs, sb)
		}
		time.Sleep(3 * time.Second) // idle
		pss, rss, _, procs := qemuMemory()
		// CPU the idle sandboxes' QEMUs use, over idleCPUWindow.
		t0, c0 := time.Now(), qemuCPU()
		time.Sleep(idleCPUWindow)
		cpuPct := 100 * (qemuCPU() - c0).Seconds() / time.Since(t0).Seconds() / float64(count)
		for _, s := range sbs {
			s.Destroy()
		}
		if procs != count {
			return fmt.Errorf("pss: found %d QEMU processes, want %d", procs, count)
		}
		pssRows = append(pssRows, pssRow{n: count, perMiB: float64(pss) / float64(count) / 1024, rss: float64(rss) / float64(count) / 1024, cpu: cpuPct})
		progress("PSS with %d idle sandboxes: %.1f MiB each; CPU %.2f%% of a core each", count, float64(pss)/float64(count)/1024, cpuPct)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "# Sandbox latency and memory (bench/sandbox)\n\n")
	cache := c.tcgCache
	if cache == 0 {
		cache = microvm.DefaultTCGCacheMB
	}
	thp := "off for clones"
	if c.tcgHugePages || d.Accelerator() != "tcg" {
		thp = "as the host sets them"
	}
	aslr := "on"
	if !c.tcgASLR && d.Accelerator() == "tcg" {
		aslr = "off (norandmaps)"
	}
	lsm := "the kernel's default"
	if !c.tcgGuestLSM && d.Accelerator() == "tcg" {
		lsm = "landlock, lockdown and yama only, no pressure stall accounting"
	}
	tick := "periodic (250 Hz)"
	if d.TicklessIdle() {
		tick = "stopped while idle (ARAT, tsc=reliable)"
	}
	if m := d.CPUModel(); m != "" {
		tick += "; the guest's CPU model " + m
	}
	_, kernel := t.KernelFor(1)
	if t.KernelUP != nil {
		kernel += ", uniprocessor"
	}
	fmt.Fprintf(&b, "Run on %s, %d CPUs; QEMU microvm, accelerator **%s** (%s); template %s@%s (kernel %s); guest 256 MiB, 1 vCPU; TCG cache %d MiB; QEMU's transparent huge pages %s; the guest's address-space randomization %s; the guest's security modules %s; the guest's tick %s.\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), d.Accelerator(), d.AcceleratorReason(), t.Name, t.Version, kernel, cache, thp, aslr, lsm, tick)
	netNote := "on: each sandbox has its own network namespace behind the node's egress policy, as with `warren node --egress on` (the default as root), and a claim binds the guest's network"
	if c.egress == "off" {
		netNote = "off: sandboxes have no network (`warren node --egress off`)"
	}
	fmt.Fprintf(&b, "Egress policy %s.\n", netNote)
	fmt.Fprintf(&b, "Making the template's snapshot took %v. Every latency ends when the guest agent has run `/bin/true` and returned its exit status.\n\n", snapTook.Round(time.Millisecond))
	fmt.Fprintf(&b, "| measure | n | p50 | p99 | min | max | goal |\n|---|---|---|---|---|---|---|\n")
	for _, s := range all {
		g := s.goal
		if s.goalMS > 0 {
			met := "missed"
			switch {
			case len(s.samples) == 0:
				met = "not measured in this run"
			case float64(s.pct(0.5).Microseconds())/1000 <= s.goalMS:
				met = "met"
			}
			g += " — " + met
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s |\n", s.name, len(s.samples), ms(s.pct(0.5)), ms(s.pct(0.99)), ms(s.pct(0)), ms(s.pct(1)), g)
	}
	fmt.Fprintf(&b, "\nRatios of medians: cold boot / warm claim %.0f×, restore / warm claim %.1f×, restore with QEMU's start / onto a standby %.2f×",
		ratio(boot, warm), ratio(restore, warm), ratio(burst, restore))
	for _, s := range all[4:] {
		fmt.Fprintf(&b, ", %s / warm claim %.1f×", strings.SplitN(s.name, " (", 2)[0], ratio(s, warm))
	}
	fmt.Fprintf(&b, ".\n\n")
	if len(restore.phases) > 0 || len(warm.phases) > 0 {
		fmt.Fprintf(&b, "Where a claim's time goes (medians of each phase, so they need not add up to the total's median): "+
			"launch is QEMU's start until its QMP socket answers (made before the claim for a standby QEMU), load the snapshot's device state, resume QMP `cont` until the guest agent answers "+
			"(a warm VM's agent is connected already), bind the claim call into the guest (clock, entropy, hostname, environment, limits), "+
			"first command the `/bin/true` round trip, of which in the guest is the agent's start of the command to its exit status. A claim does not wait for its bind's answer (its first command follows the bind "+
			"to the guest at once), so bind is timed from sending to the answer and overlaps the first command.\n\n")
		fmt.Fprintf(&b, "| claim | overlay | launch | load | resume | bind | first command | of it in the guest | total |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range []*series{restore, burst, warm} {
			if len(s.phases) == 0 {
				continue
			}
			fmt.Fprintf(&b, "| %s |", strings.SplitN(s.name, " (", 2)[0])
			for _, f := range []func(phases) time.Duration{
				func(x phases) time.Duration { return x.Overlay }, func(x phases) time.Duration { return x.Launch },
				func(x phases) time.Duration { return x.Load }, func(x phases) time.Duration { return x.Resume },
				func(x phases) time.Duration { return x.Bind }, func(x phases) time.Duration { return x.First },
				func(x phases) time.Duration { return x.InGuest },
			} {
				fmt.Fprintf(&b, " %s |", ms(median(s.phases, f)))
			}
			fmt.Fprintf(&b, " %s |\n", ms(s.pct(0.5)))
		}
		fmt.Fprintf(&b, "\n")
	}
	fmt.Fprintf(&b, "| idle sandboxes | PSS per sandbox | RSS per sandbox | goal | CPU per idle sandbox (%% of a core, over %v) |\n|---|---|---|---|---|\n", idleCPUWindow)
	for _, r := range pssRows {
		g := ""
		if r.n == 50 {
			g = "≤ 32 MiB — missed"
			if r.perMiB <= 32 {
				g = "≤ 32 MiB — met"
			}
		}
		fmt.Fprintf(&b, "| %d | %.1f MiB | %.1f MiB | %s | %.2f%% |\n", r.n, r.perMiB, r.rss, g, r.cpu)
	}
	if standbyPSS > 0 {
		fmt.Fprintf(&b, "\nAn idle standby QEMU (one per template by default, for cold claims; not counted above), alone on the host: PSS %.1f MiB, RSS %.1f MiB; "+
			"of its PSS %.1f MiB is anonymous (its own: QEMU's heap and the relocated data of its binary and libraries), the rest file pages (mostly QEMU's binary and libraries), which it shares with every clone's QEMU.\n",
			float64(standbyPSS)/1024, float64(standbyRSS)/1024, float64(standbyAnon)/1024)
	}
	if ctrNote != "" {
		fmt.Fprintf(&b, "\nPeer: %s\n", ctrNote)
	}
	fmt.Print(b.String())
	if c.out != "" {
		return os.WriteFile(c.out, []byte(b.String()), 0o644)
	}
	return nil
}

func ratio(a, b *series) float64 {
	if b.pct(0.5) == 0 {
		return 0
	}
	return float64(a.pct(0.5)) / float64(b.pct(0.5))
}

// waitPool waits for n warm VMs of the default template.
func waitPool(d *microvm.Driver, n int) error {
	return waitPools(d, "warm pool did not fill", func(p driver.PoolStatus) bool { return p.Ready >= n })
}

// waitStandby waits for n standby QEMUs of the default template.
func waitStandby(d *microvm.Driver, n int) error {
	return waitPools(d, "no standby QEMU launched", func(p driver.PoolStatus) bool { return p.Standby >= n })
}

func waitPools(d *microvm.Driver, what string, ok func(driver.PoolStatus) bool) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		for _, p := range d.Pools() {
			if p.Template == "default" && ok(p) {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s in 2 minutes: %+v", what, d.Pools())
}

// idleCPUWindow is how long the bench watches idle sandboxes' CPU use.
const idleCPUWindow = 5 * time.Second

// qemuCPU sums the CPU time (user and system) of this host's warren QEMU
// processes so far.
func qemuCPU() time.Duration {
	var ticks int64
	for _, dir := range qemuProcs() {
		b, err := os.ReadFile(filepath.Join(dir, "stat"))
		if err != nil {
			continue
		}
		// The fields after the command's closing parenthesis: utime and
		// stime are the 12th and 13th of them (fields 14 and 15 of stat).
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		k, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + k
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on Linux
// for every architecture Go supports here.
const clockTicks = 100

// qemuProcs returns the /proc directories of this host's warren QEMUs.
func qemuProcs() []string {
	var out []string
	ms, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, m := range ms {
		b, err := os.ReadFile(m)
		if err != nil || !strings.Contains(string(b), "\x00-name\x00warren-") || !strings.Contains(string(b), "qemu-system") {
			continue
		}
		out = append(out, filepath.Dir(m))
	}
	return out
}

// qemuMemory sums Pss, Rss and Pss_Anon (KiB) of this host's warren QEMU
// processes.
func qemuMemory() (pss, rss, anon int64, procs int) {
	for _, dir := range qemuProcs() {
		r, err := os.ReadFile(filepath.Join(dir, "smaps_rollup"))
		if err != nil {
			continue
		}
		procs++
		for _, l := range strings.Split(string(r), "\n") {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			v, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "Pss:":
				pss += v
			case "Rss:":
				rss += v
			case "Pss_Anon:":
				anon += v
			}
		}
	}
	return pss, rss, anon, procs
}

// containers times `ctr run --rm` of /bin/true on the template's root
// tree, starting a private containerd when no socket is given.
func containers(c config, s *series) (string, error) {
	for _, bin := range []string{"containerd", "ctr", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			return "", fmt.Errorf("%s not installed (apt-get install containerd runc)", bin)
		}
	}
	rootfs := c.rootfs
	if rootfs == "" {
		ms, _ := filepath.Glob(filepath.Join(c.imageDir, ".cache", "default-rootfs-*"))
		if len(ms) == 0 {
			return "", fmt.Errorf("no root tree in %s/.cache (give -rootfs)", c.imageDir)
		}
		rootfs = ms[0]
	}
	sock := c.ctrSocket
	if sock == "" {
		dir, err := os.MkdirTemp("", "warren-ctd-")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(dir)
		sock = filepath.Join(dir, "c.sock")
		cmd := exec.Command("containerd", "--root", filepath.Join(dir, "root"), "--state", filepath.Join(dir, "state"), "--address", sock)
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		if err := cmd.Start(); err != nil {
			return "", err
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		for i := 0; i < 500; i++ {
			if exec.Command("ctr", "--address", sock, "version").Run() == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	out, _ := exec.Command("containerd", "--version").Output()
	rv, _ := exec.Command("runc", "--version").Output()
	for i := 0; i < c.ctrs+1; i++ {
		t0 := time.Now()
		o, err := exec.Command("ctr", "--address", sock, "-n", "warren-bench", "run", "--rm", "--rootfs", rootfs,
			fmt.Sprintf("bench-%d-%d", os.Getpid(), i), "/bin/true").CombinedOutput()
		took := time.Since(t0)
		if err != nil {
			return "", fmt.Errorf("ctr run: %v: %s", err, strings.TrimSpace(string(o)))
		}
		if i > 0 { // the first start warms containerd's caches
			s.samples = append(s.samples, took)
		}
	}
	progress("containers: p50 %v", s.pct(0.5).Round(time.Millisecond))
	return fmt.Sprintf("%s, runc %s; root tree %s; each sample is the whole `ctr run --rm` process (its own start-up, the container's create, start, exit and removal), so it is an upper bound of the start alone.",
		strings.TrimSpace(string(out)), firstLine(string(rv)), rootfs), nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return strings.TrimPrefix(strings.TrimSpace(s), "runc version ")
}
