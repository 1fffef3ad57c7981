package main

import (
	"bytes"
	"context"
	"flag"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/internal/testenv"
	"github.com/warrenhq/warren/netpolicy"
	"github.com/warrenhq/warren/noded"
)

// needEgressHost skips unless this host can make a microvm node's egress
// policy: root, /dev/net/tun, QEMU and the default template.
func needEgressHost(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root for egress")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		testenv.Missing(t, "needs /dev/net/tun")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		testenv.Missing(t, "needs QEMU")
	}
	if _, err := guest.LoadTemplate(defaultImageDir(), "default"); err != nil {
		testenv.Missing(t, "needs the default template (make image)")
	}
}

// egressLeftovers lists the network namespaces and links of the egress
// policy tagged tag still on the host, and reaps them at the test's end
// as the next run with the same id and data directory would.
func egressLeftovers(t *testing.T, id, data, prefix4, prefix6 string) func() []string {
	tag := egressTag(id, data)
	t.Cleanup(func() {
		eg, err := (&egressFlags{mode: "on", prefix4: prefix4, prefix6: prefix6}).
			start(&nodeFlags{id: id, data: data})
		if err == nil {
			eg.ReapOrphans()
			eg.Close()
		}
	})
	return func() []string {
		var left []string
		ents, _ := os.ReadDir("/run/netns")
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "warren-"+tag+"-") {
				left = append(left, e.Name())
			}
		}
		if links, _ := exec.Command("ip", "-br", "link").Output(); strings.Contains(string(links), "w"+tag+"-") {
			left = append(left, "links w"+tag+"-*")
		}
		return left
	}
}

// A `warren dev` whose start fails after its node's egress policy was made
// (here: the API port is busy) closes it: no namespace or link stays.
func TestDevFailedStartClosesEgress(t *testing.T) {
	needEgressHost(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	data := filepath.Join(t.TempDir(), "dev")
	left := egressLeftovers(t, "dev", filepath.Join(data, "node"), netpolicy.DefaultPrefix4.String(), netpolicy.DefaultPrefix6.String())
	var out, errb bytes.Buffer
	err = run([]string{"dev", "--driver", "microvm", "--egress", "on", "--data", data, "--api", busy.Addr().String(), "--log-level", "error"}, &out, &errb)
	if err != nil && strings.HasPrefix(err.Error(), "egress:") {
		// warren dev has no flag for the egress prefixes: another node
		// on this host with the default ones keeps its policy from
		// starting.
		t.Skipf("the egress policy could not start here: %v", err)
	}
	if err == nil || !strings.HasPrefix(err.Error(), "api:") || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("dev on a busy port: %v, want the API's bind error\n%s", err, errb.String())
	}
	if l := left(); len(l) > 0 {
		t.Errorf("warren dev failed (%v) but left its egress behind: %v", err, l)
	}
}

// A `warren node` whose daemon fails to start (here: its gossip port is
// busy) closes the driver and egress policy that config made.
func TestNodeFailedStartClosesEgress(t *testing.T) {
	needEgressHost(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	data := filepath.Join(t.TempDir(), "node")
	left := egressLeftovers(t, "n1", data, "10.221.0.0/16", "fd77:6172:7221::/64")
	var out, errb bytes.Buffer
	err = run([]string{"node", "--id", "n1", "--data", data, "--servers", "http://127.0.0.1:1", "--gossip", busy.Addr().String(),
		"--driver", "microvm", "--egress", "on", "--standby-qemus", "0", "--log-level", "error",
		// Prefixes of its own: another node on this host may hold the defaults.
		"--egress-prefix4", "10.221.0.0/16", "--egress-prefix6", "fd77:6172:7221::/64"}, &out, &errb)
	if err == nil || !strings.HasPrefix(err.Error(), "node n1:") {
		t.Fatalf("node on a busy gossip port: %v, want the daemon's start error", err)
	}
	if l := left(); len(l) > 0 {
		t.Errorf("warren node failed (%v) but left its egress behind: %v", err, l)
	}
}

// Flag errors found after the driver was chosen (--gossip-profile,
// --count) are reported by config with the others, so that the caller's
// one error path closes what config made.
func TestNodeConfigReportsCountAndGossipProfile(t *testing.T) {
	for _, c := range []struct {
		args  []string
		want  string // in the error; "" for none
		fleet bool
	}{
		{[]string{"--count", "2", "--gossip-profile", "bogus"}, "gossip-profile", false},
		{[]string{"--count", "10001"}, "count", false},
		{[]string{"--count", "2", "--driver", "microvm", "--egress", "off"}, "count", false},
		{[]string{"--count", "3"}, "", true},
		{[]string{"--gossip-profile", "fleet"}, "", true},
		{[]string{"--count", "3", "--gossip-profile", "lan"}, "", false},
		// What the servers would refuse in every hello, refused at start.
		{[]string{"--id", "Node1"}, `id: "Node1" must be`, false},
		{[]string{"--labels", "Zone=a"}, `labels: key "Zone" must be`, false},
		{[]string{"--templates", "Default"}, `templates[0]: "Default" must be`, false},
		{[]string{"--id", strings.Repeat("a", 60), "--count", "2"}, `-0002" must be`, false},
	} {
		cfg, err := parseNodeFlags(t, append([]string{"--driver", "sim"}, c.args...)...)
		switch {
		case c.want == "" && (err != nil || cfg.GossipFleet != c.fleet):
			t.Errorf("%v: %v, fleet gossip %v; want no error, fleet gossip %v", c.args, err, cfg.GossipFleet, c.fleet)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: %v, want an error naming %s", c.args, err, c.want)
		}
	}
}

// A node advertising a template its driver lacks is refused at start:
// every task placed there for it would fail its claim.
func TestNodeTemplatesTheDriverLacks(t *testing.T) {
	drv := templateDriver{noDriver{}, []string{"default", "go"}}
	if errs := checkTemplates(drv, []string{"default", "go"}); len(errs) > 0 {
		t.Errorf("templates the driver has: %v", errs)
	}
	errs := checkTemplates(drv, []string{"go", "rust"})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), `templates: "rust": the fake driver has no such template (have: default, go`) {
		t.Errorf("a template the driver lacks: %v", errs)
	}
	if errs := checkTemplates(noDriver{}, []string{"rust"}); len(errs) > 0 {
		t.Errorf("a driver that lists no templates (sim) is not checked: %v", errs)
	}
}

type templateDriver struct {
	noDriver
	have []string
}

func (d templateDriver) Name() string        { return "fake" }
func (d templateDriver) Templates() []string { return d.have }

// parseNodeFlags parses `warren node` flags after a valid --id, --data,
// --servers and --gossip, returns the config made and closes its driver
// and egress at the test's end.
func parseNodeFlags(t *testing.T, args ...string) (noded.Config, error) {
	t.Helper()
	var f nodeFlags
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	f.register(fs)
	if err := fs.Parse(append([]string{"--id", "n", "--data", t.TempDir(), "--servers", "http://127.0.0.1:7480", "--gossip", "127.0.0.1:0"}, args...)); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.config()
	t.Cleanup(func() {
		if cfg.Driver != nil {
			cfg.Driver.Close()
		}
		cfg.Egress.Close()
	})
	return cfg, err
}

// A node restarted with --egress off after a run with egress policy that
// ended uncleanly (killed: its sandboxes' namespaces and links, and the
// node's table, stay) removes what that run left: nothing else would, and
// a re-adopted sandbox would keep its old rules with no audit.
func TestNodeWithEgressOffRemovesAnEarlierRunsEgress(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root for egress")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		testenv.Missing(t, "needs /dev/net/tun")
	}
	data := filepath.Join(t.TempDir(), "node")
	// Prefixes of its own: another node on this host may hold the defaults.
	const p4, p6 = "10.223.0.0/16", "fd77:6172:7223::/64"
	f := &nodeFlags{id: "n1", data: data, egress: egressFlags{mode: "on", prefix4: p4, prefix6: p6}}
	cfg, err := f.egress.netConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	m, err := netpolicy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	left := egressLeftovers(t, "n1", data, p4, p6)
	if _, err := m.Claim(context.Background(), "sb-left", netpolicy.Policy{}); err != nil {
		m.Close()
		t.Fatal(err)
	}
	m.Detach() // as a kill leaves it
	if len(left()) == 0 {
		t.Fatal("the trap is not set: the earlier run left nothing")
	}
	f.egress.mode = "off"
	nets, err := f.networks()
	if err != nil || nets != nil {
		t.Fatalf("networks with --egress off: %v %v", nets, err)
	}
	if l := left(); len(l) > 0 {
		t.Errorf("the earlier run's egress is still on the host: %v", l)
	}
}
