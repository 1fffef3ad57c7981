package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/internal/gossip"
	"github.com/warrenhq/warren/noded"
	"github.com/warrenhq/warren/noded/driver"
	"github.com/warrenhq/warren/noded/driver/container"
	"github.com/warrenhq/warren/noded/driver/microvm"
	"github.com/warrenhq/warren/noded/driver/sim"
	"github.com/warrenhq/warren/scheduler"
)

type nodeFlags struct {
	release                                                                        func() // the data directory's lock, once config took it
	id, data, servers, gossip, join, driver, capacity, labels, templates, logLevel string
	simRestore, simExec                                                            time.Duration
	count                                                                          int
	gossipProfile                                                                  string
	metrics                                                                        string
	pprof                                                                          bool
	imageDir, accel, sandboxListen                                                 string
	containerd, runtime, runcBinary                                                string
	tcgCacheMB                                                                     int
	standbyQEMUs                                                                   int // microvm.Config.StandbyQEMUs: 0 the default, -1 none
	tcgASLR                                                                        bool
	tcgGuestLSM                                                                    bool
	tcgPeriodicTick                                                                bool
	tcgNoRDRAND                                                                    bool
	egress                                                                         egressFlags
	model                                                                          modelFlags
	forge                                                                          forgeFlags
	logger                                                                         *slog.Logger
	// why says which driver auto picked and why.
	why string
}

// setInverse parses a boolean flag that is on by default into off, its
// inverse, so that the zero value of off means the default.
func setInverse(off *bool) func(string) error {
	return func(v string) error {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("want true or false, not %q", v)
		}
		*off = !on
		return nil
	}
}

func (f *nodeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.id, "id", "", "node id, unique in the cluster (required)")
	fs.StringVar(&f.data, "data", "", "data directory (required)")
	fs.StringVar(&f.servers, "servers", "", "comma-separated API URLs of the servers (required)")
	fs.StringVar(&f.gossip, "gossip", "", "HOST:PORT for memberlist gossip, UDP and TCP (required)")
	fs.StringVar(&f.join, "join-gossip", "", "comma-separated gossip HOST:PORTs of members to join (servers or nodes)")
	fs.StringVar(&f.driver, "driver", "", "sandbox driver: auto, microvm, container or sim (simulated) (required); auto picks microvm when QEMU and a template are present")
	fs.StringVar(&f.imageDir, "image-dir", defaultImageDir(), "microvm: the template store (env WARREN_IMAGE_DIR)")
	fs.StringVar(&f.accel, "accel", "auto", "microvm: accelerator: auto (probe KVM once, else TCG), kvm or tcg")
	fs.IntVar(&f.tcgCacheMB, "tcg-cache-mb", microvm.DefaultTCGCacheMB, "microvm under TCG: translation cache per VM in MiB (resident as used; smaller saves memory, larger saves retranslation)")
	fs.Func("standby-qemus", fmt.Sprintf("microvm: QEMUs per template kept launched ahead, waiting to load its snapshot, so a cold claim (no warm sandbox ready) skips QEMU's start; each costs an idle QEMU process and no CPU (default %d; 0 keeps none)", microvm.DefaultStandbyQEMUs), func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > 64 {
			return fmt.Errorf("want a count between 0 and 64")
		}
		f.standbyQEMUs = n
		if n == 0 {
			f.standbyQEMUs = -1
		}
		return nil
	})
	// Inverted, so that `warren dev`, which does not register them, gets
	// the defaults too.
	fs.BoolFunc("tcg-tickless-idle", "microvm under TCG, where the host's TSC is reliable: guests stop their 250 Hz tick while idle, which cuts an idle sandbox's CPU 3-5x (default true; =false keeps the periodic tick)", setInverse(&f.tcgPeriodicTick))
	fs.BoolFunc("tcg-rdrand", "microvm under TCG: guests' CPU model has RDRAND, served from the host's getrandom; a restored clone reaches its first command about a fifth sooner with it (default true; =false gives QEMU's plain qemu64)", setInverse(&f.tcgNoRDRAND))
	fs.BoolVar(&f.tcgGuestLSM, "tcg-guest-lsm", false, "microvm under TCG: keep the guest kernel's default security modules (AppArmor, TOMOYO) and pressure stall accounting (off by default: guests boot with lsm=landlock,lockdown,yama psi=0: their hooks cost translation in every fresh clone and time in every command)")
	fs.BoolVar(&f.tcgASLR, "tcg-aslr", false, "microvm under TCG: keep address-space layout randomization inside guests (off by default: with it every exec in a guest translates the dynamic loader and libc again)")
	fs.StringVar(&f.containerd, "containerd", container.DefaultSocket, "container: containerd's socket")
	fs.StringVar(&f.runtime, "runtime", "runc", "container: runc, or runsc (gVisor through the runc shim; needs --egress off)")
	fs.StringVar(&f.runcBinary, "runc-binary", "", "container: the OCI runtime binary the runc shim runs instead of runc (for --runtime runsc, the driver writes its own wrapper unless this names one)")
	f.egress.register(fs)
	f.model.register(fs)
	f.forge.register(fs)
	fs.StringVar(&f.sandboxListen, "sandbox-listen", "", "HOST:PORT of the node's sandbox API, which servers forward to (default: the gossip host, any port)")
	fs.StringVar(&f.capacity, "capacity", "", "what tasks may use, cpu=N,mem=SIZE (default: this host's cores and memory)")
	fs.StringVar(&f.labels, "labels", "", "comma-separated k=v labels (the \"zone\" label spreads tasks)")
	fs.StringVar(&f.templates, "templates", "", "comma-separated sandbox templates this node serves")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&f.simRestore, "sim-restore-latency", 0, "sim driver only: simulated sandbox restore time")
	fs.DurationVar(&f.simExec, "sim-exec-latency", 0, "sim driver only: simulated time of every command")
	fs.IntVar(&f.count, "count", 1, "sim driver only: host this many simulated nodes in this process, ids ID-0001...; the process is one memberlist member for all of them")
	fs.StringVar(&f.gossipProfile, "gossip-profile", "", "lan (probe every 250 ms) or fleet (memberlist's 1 s timing, for many simulated nodes per process); default lan, fleet with --count > 1")
	fs.StringVar(&f.metrics, "metrics", "", "HOST:PORT to serve the nodes' counters and append latency as JSON at /metrics")
	fs.BoolVar(&f.pprof, "pprof", false, "also serve Go profiles at /debug/pprof/ on the --metrics address")
}

func cmdNode(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	var f nodeFlags
	f.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos); err != nil {
		return err
	}
	log, err := newLogger(stderr, f.logLevel)
	if err != nil {
		return err
	}
	f.logger = log
	cfg, err := f.config()
	defer f.unlock()
	if err != nil {
		cfg.Driver.Close() // one config made before it failed
		cfg.Egress.Close()
		return err
	}
	if f.why != "" {
		log.Info("driver chosen", "driver", cfg.Driver.Name(), "why", f.why)
	}
	cfg.Logger = log
	cfg.Metrics = &noded.Metrics{}
	cfgs := []noded.Config{cfg}
	if f.count > 1 {
		if cfgs, err = f.fleet(cfg); err != nil {
			cfg.Driver.Close()
			cfg.Egress.Close()
			return err
		}
	}
	var daemons []*noded.Daemon
	var member *gossip.Member
	// closeAll closes the daemons started and what config and fleet made
	// that no daemon took over: the drivers of the configs not started
	// and, with no daemon started, the egress policy (its namespaces and
	// links would stay on the host).
	closeAll := func() error {
		var errs []error
		for _, d := range daemons {
			errs = append(errs, d.Close())
		}
		for _, c := range cfgs[len(daemons):] {
			errs = append(errs, c.Driver.Close())
		}
		if len(daemons) == 0 {
			errs = append(errs, cfg.Egress.Close())
		}
		if member != nil {
			errs = append(errs, member.Close())
		}
		return errors.Join(errs...)
	}
	if f.count > 1 {
		// The simulated nodes of one process share its fate, so they share
		// one memberlist member; sessions and heartbeats stay per node.
		member, err = gossip.Start(gossip.Config{Role: gossip.RoleFleet, ID: f.id, Count: f.count, Addr: cfg.GossipAddr,
			Join: cfg.JoinGossip, Logger: log, Fleet: cfg.GossipFleet})
		if err != nil {
			closeAll()
			return err
		}
	}
	for _, c := range cfgs {
		d, err := noded.Start(c)
		if err != nil {
			closeAll()
			return fmt.Errorf("node %s: %w", c.ID, err)
		}
		daemons = append(daemons, d)
	}
	if f.metrics != "" {
		ln, err := net.Listen("tcp", f.metrics)
		if err != nil {
			closeAll()
			return fmt.Errorf("metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(cfg.Metrics.Snapshot(daemons))
		})
		if f.pprof {
			servePprof(mux)
		}
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(ln)
		defer hs.Close()
	}
	log.Info("node daemons running", "count", len(daemons))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	s := <-sig
	log.Info("shutting down", "signal", s.String())
	return closeAll()
}

// fleet derives count simulated nodes from one config: ids ID-0001...,
// data dirs under DATA, one shared client, appender and session transport,
// and no gossip of their own (the process is one memberlist member).
func (f *nodeFlags) fleet(base noded.Config) ([]noded.Config, error) {
	shared, err := noded.NewShared(base.Servers)
	if err != nil {
		return nil, err
	}
	out := make([]noded.Config, f.count)
	for i := range out {
		c := base
		c.ID = gossip.FleetNodeID(base.ID, i+1)
		c.DataDir = filepath.Join(base.DataDir, c.ID)
		c.GossipAddr = ""
		c.Address = base.GossipAddr
		if i > 0 { // the first takes base's; one simulated driver per node
			if c.Driver, err = newDriver(f); err != nil {
				for _, o := range out[1:i] {
					o.Driver.Close()
				}
				return nil, err
			}
		}
		c.Shared = shared
		c.Logger = base.Logger.With("node", c.ID)
		out[i] = c
	}
	return out, nil
}

// unlock releases the data directory's lock config took, if it did.
func (f *nodeFlags) unlock() {
	if f.release != nil {
		f.release()
		f.release = nil
	}
}

func (f *nodeFlags) config() (noded.Config, error) {
	var errs []error
	cfg := noded.Config{ID: f.id, DataDir: f.data, GossipAddr: f.gossip, Address: f.gossip}
	if f.data != "" {
		if abs, err := filepath.Abs(f.data); err == nil {
			cfg.DataDir = abs
		}
	}
	cfg.Servers = splitComma(f.servers)
	cfg.JoinGossip = splitComma(f.join)
	cfg.Templates = splitComma(f.templates)
	if f.gossip == "" {
		errs = append(errs, errors.New("gossip: required (HOST:PORT)"))
	}
	if f.count < 1 || f.count > 10000 {
		errs = append(errs, fmt.Errorf("count: must be 1..10000, got %d", f.count))
	} else if f.count > 1 && f.driver != "sim" {
		errs = append(errs, errors.New("count: more than one node per process is only for --driver sim (simulated fleets)"))
	}
	switch f.gossipProfile {
	case "":
		cfg.GossipFleet = f.count > 1
	case "lan":
	case "fleet":
		cfg.GossipFleet = true
	default:
		errs = append(errs, fmt.Errorf("gossip-profile: %q is not lan or fleet", f.gossipProfile))
	}
	// The flags only some drivers use are checked for every driver; when
	// one is wrong, no driver (nor egress policy) is made.
	var drv driver.Driver
	var err error
	// The data directory's lock before any driver: a microvm or container
	// driver destroys what it finds there from an earlier run, which would
	// be a live node's sandboxes if another one used the directory.
	var lockErr error
	if f.data != "" && f.release == nil {
		f.release, lockErr = lockData(f.data)
	}
	// A driver other than sim serves the sandbox API on the gossip host
	// unless --sandbox-listen says otherwise: checked here, before any
	// driver, naming the flag given (the node said --sandbox-listen,
	// which was not, and only after its driver had started).
	if host, _, err := net.SplitHostPort(f.gossip); err == nil && f.sandboxListen == "" && f.driver != "" && f.driver != "sim" {
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			errs = append(errs, fmt.Errorf("gossip: %q: the sandbox API listens on the gossip host, which must be one servers reach this node at; give one, or --sandbox-listen HOST:PORT", f.gossip))
		}
	}
	if lockErr != nil {
		errs = append(errs, lockErr) // and no driver is made
	}
	if ferrs := f.checkDriverFlags(); len(ferrs) > 0 {
		errs = append(errs, ferrs...)
	} else if lockErr == nil {
		if drv, err = newDriver(f); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, checkTemplates(drv, cfg.Templates)...)
	if cfg.Capacity, err = parseCapacity(f.capacity); err != nil {
		errs = append(errs, err)
		cfg.Capacity = &warrenv1.Resources{MilliCpu: 1, MemoryBytes: 1} // reported above
	}
	if cfg.Labels, err = parseLabels(f.labels); err != nil {
		errs = append(errs, err)
	}
	if f.pprof && f.metrics == "" {
		errs = append(errs, errors.New("pprof: needs --metrics, the address it is served on"))
	}
	if f.driver == "" {
		errs = append(errs, errors.New("driver: required: sim (simulated), microvm or container"))
	}
	cfg.Driver = drv
	cfg.Egress = f.egress.mgr
	if cfg.Models, err = f.model.models(); err != nil {
		errs = append(errs, err)
	}
	if f.model.approvalGrace < 0 {
		errs = append(errs, fmt.Errorf("approval-grace: %s is negative", f.model.approvalGrace))
	}
	cfg.ApprovalGrace = f.model.approvalGrace
	if cfg.Git, err = f.forge.service(f.data); err != nil {
		errs = append(errs, err)
	}
	if at := os.Getenv("WARREN_TEST_CRASH_AFTER"); at != "" {
		// A test knob: die (SIGKILL, no shutdown path) right after the
		// agent event with this key lands, e.g. "agent/step-3/model".
		cfg.AfterRecord = func(key string) {
			if key == at {
				fmt.Fprintf(os.Stderr, "WARREN_TEST_CRASH_AFTER: killing this node process after %s\n", key)
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
	}
	if drv != nil && drv.Name() != "sim" {
		cfg.SandboxListen = f.sandboxListen
		if cfg.SandboxListen == "" {
			host, _, _ := net.SplitHostPort(f.gossip)
			cfg.SandboxListen = net.JoinHostPort(host, "0")
		}
	} else if f.sandboxListen != "" {
		errs = append(errs, errors.New("sandbox-listen: only for the microvm and container drivers"))
	}
	// What the servers would refuse in every hello (the node would run,
	// never registered, saying so only in debug logs): checked here, the
	// node's fields named by their flags (node.id is --id).
	id := cfg.ID
	if f.count > 1 {
		id = gossip.FleetNodeID(cfg.ID, f.count) // the longest of the fleet's
	}
	reg := &warrenv1.Node{Id: id, Drivers: []string{"sim"}, Templates: cfg.Templates, Capacity: cfg.Capacity, Labels: cfg.Labels}
	if err := scheduler.ValidateNode(reg); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			errs = append(errs, errors.New(strings.TrimPrefix(line, "node.")))
		}
	}
	if drv == nil {
		cfg.Driver = noDriver{} // reported above; keep Validate from repeating it
	}
	return cfg, errors.Join(append(errs, cfg.Validate())...)
}

// checkTemplates checks that drv, if it lists its templates, has each of
// --templates: the servers place a task needing a template on a node
// that advertises it, and one the driver lacks would fail every claim.
func checkTemplates(drv driver.Driver, templates []string) []error {
	lt, ok := drv.(interface{ Templates() []string })
	if !ok {
		return nil
	}
	var errs []error
	have := lt.Templates()
	for _, t := range templates {
		if !slices.Contains(have, t) {
			errs = append(errs, fmt.Errorf("templates: %q: the %s driver has no such template (have: %s; build one with make image)",
				t, drv.Name(), strings.Join(have, ", ")))
		}
	}
	return errs
}

// checkDriverFlags checks the flags that only some drivers use (or none:
// a bad --driver), whichever driver is chosen, so that a typo is refused
// before it matters.
func (f *nodeFlags) checkDriverFlags() []error {
	var errs []error
	switch f.driver {
	case "", "auto", "microvm", "container", "sim":
	default:
		errs = append(errs, fmt.Errorf("driver: %q is not auto, microvm, container or sim", f.driver))
	}
	if err := microvm.CheckAccel(f.accel); err != nil {
		errs = append(errs, fmt.Errorf("accel: %w", err))
	}
	if err := container.CheckRuntime(f.runtime); err != nil {
		errs = append(errs, fmt.Errorf("runtime: %w", err))
	}
	if err := f.egress.check(f); err != nil {
		errs = append(errs, err)
	}
	return errs
}

func newDriver(f *nodeFlags) (driver.Driver, error) {
	if f.driver != "sim" && (f.simRestore != 0 || f.simExec != 0) {
		return nil, errors.New("sim-restore-latency, sim-exec-latency: only for --driver sim")
	}
	name := f.driver
	if name == "auto" {
		name, f.why = autoDriver(f.imageDir)
	}
	switch name {
	case "sim":
		return sim.New(sim.Config{RestoreLatency: f.simRestore, WarmLatency: f.simRestore / 10, ExecLatency: f.simExec}), nil
	case "microvm":
		if f.data == "" {
			return nil, nil // data: required is reported
		}
		log := f.logger
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		if f.tcgCacheMB < 8 || f.tcgCacheMB > 2048 {
			return nil, fmt.Errorf("tcg-cache-mb: %d must be between 8 and 2048", f.tcgCacheMB)
		}
		nets, err := f.networks()
		if err != nil {
			return nil, err
		}
		d, err := microvm.New(microvm.Config{ImageDir: f.imageDir, StateDir: filepath.Join(f.data, "microvm"), Accel: f.accel,
			TCGCacheMB: f.tcgCacheMB, TCGASLR: f.tcgASLR, TCGGuestLSM: f.tcgGuestLSM, TCGPeriodicTick: f.tcgPeriodicTick, TCGNoRDRAND: f.tcgNoRDRAND, StandbyQEMUs: f.standbyQEMUs, Networks: nets, Logger: log})
		if err != nil {
			f.closeEgress()
			if f.why != "" { // auto picked it: say so and why, as for container
				return nil, fmt.Errorf("driver: %s: %w", f.why, err)
			}
			return nil, fmt.Errorf("driver: %w", err)
		}
		f.reapEgress() // the driver has re-adopted its sandboxes and taken back their networks
		return d, nil
	case "container":
		if f.data == "" {
			return nil, nil // data: required is reported
		}
		log := f.logger
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		nets, err := f.networks()
		if err != nil {
			return nil, err
		}
		d, err := container.New(container.Config{Socket: f.containerd, Runtime: f.runtime, RuncBinary: f.runcBinary, ImageDir: f.imageDir,
			StateDir: filepath.Join(f.data, "container"), Networks: nets, Logger: log})
		if err != nil {
			f.closeEgress()
			return nil, fmt.Errorf("driver: %w%s", err, f.why)
		}
		f.reapEgress() // the container driver re-adopts nothing
		return d, nil
	case "":
		return nil, nil
	}
	return nil, fmt.Errorf("driver: %q is not auto, microvm, container or sim", f.driver)
}

// networks starts the node's egress policy when it is enabled, for the
// driver to give each sandbox a network; nil means sandboxes get none.
func (f *nodeFlags) networks() (driver.Networks, error) {
	on, err := f.egress.enabled()
	if err != nil {
		return nil, err
	}
	if !on {
		f.egress.clearLeftovers(f)
		return nil, nil
	}
	eg, err := f.egress.start(f)
	if err != nil {
		return nil, err
	}
	f.egress.mgr = eg
	return eg, nil
}

func (f *nodeFlags) reapEgress() {
	if f.egress.mgr != nil {
		if err := f.egress.mgr.ReapOrphans(); err != nil && f.logger != nil {
			f.logger.Warn("egress: remove networks of an earlier run", "err", err)
		}
	}
}

func (f *nodeFlags) closeEgress() {
	if f.egress.mgr != nil {
		f.egress.mgr.Close()
		f.egress.mgr = nil
	}
}

// autoDriver picks microvm when QEMU and a default template are present,
// container otherwise, and says why.
func autoDriver(imageDir string) (string, string) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return "container", " (auto: qemu-system-x86_64 is not installed)"
	}
	t, err := guest.LoadTemplate(imageDir, "default")
	if err != nil {
		return "container", fmt.Sprintf(" (auto: no default template in %s: run `make image`)", imageDir)
	}
	return "microvm", fmt.Sprintf("auto: microvm, with QEMU and template %s@%s in %s", t.Name, t.Version, imageDir)
}

func splitComma(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parseLabels(s string) (map[string]string, error) { return parseKV("labels", s) }

// parseCapacity parses "cpu=N,mem=SIZE"; missing parts default to this
// host's cores and memory.
func parseCapacity(s string) (*warrenv1.Resources, error) {
	r := &warrenv1.Resources{MilliCpu: int64(hostCPUs()) * 1000, MemoryBytes: hostMemory()}
	seen := map[string]bool{}
	for _, kv := range splitComma(s) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("capacity: %q is not cpu=N or mem=SIZE", kv)
		}
		if seen[k] { // kept only the last, silently
			return nil, fmt.Errorf("capacity: %s given twice", k)
		}
		seen[k] = true
		switch k {
		case "cpu":
			c, err := strconv.ParseFloat(v, 64)
			// !(c >= 0.001) also refuses NaN, and what would round to 0m.
			if err != nil || !(c >= 0.001) || c > 1e6 {
				return nil, fmt.Errorf("capacity: cpu=%q is not a number of cores from 0.001 to 1000000", v)
			}
			r.MilliCpu = int64(c * 1000)
		case "mem":
			b, err := parseSize(v)
			if err != nil {
				return nil, fmt.Errorf("capacity: mem=%q: %v", v, err)
			}
			r.MemoryBytes = b
		default:
			return nil, fmt.Errorf("capacity: unknown resource %q (cpu or mem)", k)
		}
	}
	return r, nil
}

// parseSize parses 512MiB, 8GiB, 1G, 1024 (bytes) and the like.
func parseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
		{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}, {"", 1}}
	for _, u := range units {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			n, err := strconv.ParseFloat(num, 64)
			if err != nil || !(n > 0) { // NaN is not > 0 either
				return 0, errors.New("not a positive size like 512MiB or 8GiB")
			}
			if b := n * float64(u.mult); !(b >= 1) || b > 1<<60 {
				return 0, errors.New("must be from 1 byte to 1 EiB")
			}
			return int64(n * float64(u.mult)), nil
		}
	}
	return 0, errors.New("not a size")
}

func hostCPUs() int {
	n := 0
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		n = strings.Count(string(b), "\nprocessor")
		if strings.HasPrefix(string(b), "processor") {
			n++
		}
	}
	return max(n, 1)
}

func hostMemory() int64 {
	if m := noded.HostMemoryBytes(); m > 0 {
		return m
	}
	return 1 << 30
}

// noDriver stands in for a driver that failed to parse, so that Validate
// reports only the other problems. It holds nothing, so closing it is a
// no-op.
type noDriver struct{ driver.Driver }

func (noDriver) Close() error { return nil }
