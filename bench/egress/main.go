// Command egress measures per-sandbox network setup on this machine: the
// time netpolicy takes to give a sandbox its namespace, veth, addresses
// and nftables rules (Claim) and to take them away (Close), without the
// pool (every claim creates a namespace) and with it (the namespace was
// created ahead; the pool is refilled and idle before each claim).
//
// The node's side runs in a network namespace the command creates and
// removes, so it touches nothing on the machine's own network. It needs
// root. Run from the repository root:
//
//	go run ./bench/egress -out bench/results/egress.md
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/warrenhq/warren/netpolicy"
)

func main() {
	n := flag.Int("n", 200, "claims per mode")
	out := flag.String("out", "", "also write the report to this file")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "egress: needs root (network namespaces, veth, nftables)")
		os.Exit(2)
	}
	if *n < 1 || *n > 5000 {
		fmt.Fprintln(os.Stderr, "egress: -n must be between 1 and 5000")
		os.Exit(2)
	}
	hostNS := fmt.Sprintf("warren-bench-%d", os.Getpid())
	if err := netpolicy.NewNamedNS(hostNS); err != nil {
		fmt.Fprintln(os.Stderr, "egress:", err)
		os.Exit(1)
	}
	var rows []string
	for _, pool := range []int{0, 4} {
		claim, closeT, err := run(hostNS, pool, *n)
		if err != nil {
			netpolicy.DeleteNamedNS(hostNS) // os.Exit skips deferred calls
			fmt.Fprintln(os.Stderr, "egress:", err)
			os.Exit(1)
		}
		mode := "no pool (create on claim)"
		if pool > 0 {
			mode = fmt.Sprintf("pool of %d (pre-created)", pool)
		}
		rows = append(rows,
			fmt.Sprintf("| %s | setup (Claim) | %d | %s | %s |", mode, len(claim), ms(pct(claim, 50)), ms(pct(claim, 99))),
			fmt.Sprintf("| %s | teardown (Close) | %d | %s | %s |", mode, len(closeT), ms(pct(closeT, 50)), ms(pct(closeT, 99))))
		fmt.Fprintf(os.Stderr, "egress: %s done\n", mode)
	}
	netpolicy.DeleteNamedNS(hostNS)
	var b strings.Builder
	fmt.Fprintf(&b, "# Egress setup and teardown per sandbox\n\n")
	fmt.Fprintf(&b, "`go run ./bench/egress -n %d` on %s, %d CPUs, kernel %s, %s.\n\n", *n, hostname(), runtime.NumCPU(), kernel(), time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&b, "Setup is a namespace, a veth pair with IPv4 and IPv6 addresses and routes, forwarding on, and the sandbox's nftables table (sets, chains, about 60 rules) in one netlink batch; with the pool, the claim only sets the policy and binds the sandbox. Teardown removes the veth and the namespace.\n\n")
	fmt.Fprintf(&b, "| mode | step | n | p50 | p99 |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		b.WriteString(r + "\n")
	}
	fmt.Print(b.String())
	if *out != "" {
		if err := os.WriteFile(*out, []byte(b.String()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "egress:", err)
			os.Exit(1)
		}
	}
}

func run(hostNS string, pool, n int) (claim, closeT []time.Duration, err error) {
	m, err := netpolicy.New(netpolicy.Config{Tag: "bn", HostNS: "/run/netns/" + hostNS, Upstream: "198.51.100.53:53", Pool: pool, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return nil, nil, err
	}
	defer m.Close()
	ctx := context.Background()
	for i := range n {
		if pool > 0 {
			deadline := time.Now().Add(10 * time.Second)
			for m.Ready() < pool {
				if time.Now().After(deadline) {
					return nil, nil, fmt.Errorf("pool did not refill to %d in 10s", pool)
				}
				time.Sleep(time.Millisecond)
			}
		}
		t0 := time.Now()
		s, err := m.Claim(ctx, fmt.Sprintf("sb-%d", i), netpolicy.Policy{})
		if err != nil {
			return nil, nil, err
		}
		claim = append(claim, time.Since(t0))
		t0 = time.Now()
		if err := s.Close(); err != nil {
			return nil, nil, err
		}
		closeT = append(closeT, time.Since(t0))
	}
	return claim, closeT, nil
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(i, 0)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

func hostname() string { h, _ := os.Hostname(); return h }

func kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}
