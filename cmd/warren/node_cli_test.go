package main

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"
)

// TestNodeAndBenchFlagErrors: bad flags of `warren node` and `warren
// bench` are refused with every problem named, before anything starts.
func TestNodeAndBenchFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"node", "--id", "n1"}, []string{"gossip: required", "driver: required", "data: required", "servers: at least one"}},
		// A data directory that cannot be made is named along with the
		// other flags' problems; a size past 2^53 KiB wrapped negative.
		{[]string{"node", "--id", "n1", "--data", "/proc/x", "--servers", "http://a", "--gossip", "127.0.0.1:1", "--driver", "docker", "--labels", "Zone=a"},
			[]string{"data: mkdir /proc/x", `labels: key "Zone"`, "driver"}},
		{[]string{"node", "--id", "n1", "--data", "/tmp/x", "--servers", "http://a", "--gossip", "127.0.0.1:1", "--driver", "sim", "--capacity", "cpu=2,mem=1GiB,cpu=4"},
			[]string{"capacity: cpu given twice"}},
		{[]string{"node", "--id", "n1", "--data", "/tmp/x", "--servers", "http://a", "--gossip", "127.0.0.1:1", "--driver", "microvm", "--tcg-cache-mb", "0"},
			[]string{"tcg-cache-mb: 0 must be between 8 and 2048"}},
		{[]string{"node", "--id", "n1", "--data", "/proc/x", "--servers", "http://a", "--gossip", "0.0.0.0:7946", "--driver", "container"},
			[]string{`gossip: "0.0.0.0:7946": the sandbox API listens on the gossip host`}},
		{[]string{"node", "--id", "n1", "--data", "/tmp/x", "--servers", "http://a", "--gossip", "127.0.0.1:1", "--driver", "sim", "--diff-max-file-kib", "9007199254740992"},
			[]string{"diff-max-file-kib: 9007199254740992 is over the limit"}},
		{[]string{"node", "--id", "n1", "--data", "/tmp/x", "--servers", "ftp://a", "--gossip", "127.0.0.1:1", "--driver", "docker"},
			[]string{`servers: "ftp://a" must start with http://`, `driver: "docker" is not auto, microvm, container or sim`}},
		{[]string{"node", "--id", "n1", "--data", "/tmp/x", "--servers", "http://a", "--gossip", "127.0.0.1:1", "--driver", "microvm", "--image-dir", "/nonexistent", "--accel", "tcg"},
			[]string{`template "default" in /nonexistent: template not found (run ` + "`make image`" + `)`}},
		{[]string{"node", "--id", "n1", "--data", "/tmp/x", "--servers", "http://a", "--gossip", "127.0.0.1:1", "--driver", "microvm", "--accel", "hvf"},
			[]string{`accel: "hvf" is not auto, kvm or tcg`}},
		{[]string{"node", "--id", "n1", "--data", "/tmp/x", "--servers", "http://a", "--gossip", "127.0.0.1:1", "--driver", "container", "--containerd", "/nonexistent.sock"},
			[]string{`containerd socket /nonexistent.sock`}},
		{[]string{"node", "--id", "n1", "--data", "/tmp/x", "--servers", "http://a", "--gossip", "127.0.0.1:1", "--driver", "sim", "--sandbox-listen", "127.0.0.1:0"},
			[]string{`sandbox-listen: only for the microvm and container drivers`}},
		{[]string{"node", "--id", "n1", "--data", "/tmp/x", "--servers", "http://a", "--gossip", "127.0.0.1:1", "--driver", "sim", "--capacity", "cpu=0,mem=1GiB"},
			[]string{`capacity: cpu="0" is not a number of cores from 0.001 to 1000000`}},
		{[]string{"node", "--id", "n1", "--data", "/tmp/x", "--servers", "http://a", "--gossip", "127.0.0.1:1", "--driver", "sim", "--capacity", "disk=1"},
			[]string{`capacity: unknown resource "disk"`}},
		{[]string{"node", "--id", "n1", "--data", "/tmp/x", "--servers", "http://a", "--gossip", "127.0.0.1:1", "--driver", "sim", "--labels", "zone"},
			[]string{`labels: "zone" is not k=v`}},
		{[]string{"node", "--id", "n1", "--data", "/tmp/x", "--servers", "http://a", "--gossip", "127.0.0.1:1", "--driver", "sim", "--count", "0"},
			[]string{"count: must be 1..10000"}},
		{[]string{"node", "--id", "n1", "--data", "/tmp/x", "--servers", "http://a", "--gossip", "127.0.0.1:1", "--driver", "sim", "--sim-exec-latency", "1s", "--gossip-profile", "wan"},
			[]string{`gossip-profile: "wan" is not lan or fleet`}},
		{[]string{"node", "--id", "n1", "--data", "/tmp/x", "--servers", "http://a", "--gossip", "127.0.0.1:1", "--driver", "sim", "--pprof"},
			[]string{"pprof: needs --metrics"}},
		{[]string{"server", "--id", "s1", "--data", "/nonexistent/x", "--api", "127.0.0.1:0", "--raft", "127.0.0.1:2", "--max-starting", "-1"},
			[]string{"max-starting: -1 must be positive"}},
		// An empty host was advertised as http://:PORT; a negative TTL
		// declared every node down; a join URL without its scheme was
		// retried for good.
		{[]string{"server", "--id", "s1", "--data", "/nonexistent/x", "--api", ":1", "--raft", "127.0.0.1:2"},
			[]string{`api: give the address other servers reach this one at, not ""`}},
		{[]string{"server", "--id", "s1", "--data", "/nonexistent/x", "--api", "127.0.0.1:1", "--raft", ":2"},
			[]string{`raft: ":2" must be an address other servers can reach`}},
		{[]string{"server", "--id", "s1", "--data", "/nonexistent/x", "--api", "127.0.0.1:0", "--raft", "127.0.0.1:2", "--node-ttl", "-1s", "--election-timeout", "-2s"},
			[]string{"node-ttl: -1s must not be negative", "election-timeout: -2s must not be negative"}},
		{[]string{"server", "--id", "s1", "--data", "/nonexistent/x", "--api", "127.0.0.1:0", "--raft", "127.0.0.1:2", "--node-ttl", "500ms"},
			[]string{"node-ttl: 500ms must be longer than node-heartbeat 500ms"}},
		// Checked as they run, the defaults put in for 0, and before any
		// port or store is opened.
		{[]string{"server", "--id", "s1", "--data", "/nonexistent/x", "--api", "127.0.0.1:0", "--raft", "127.0.0.1:2", "--node-heartbeat", "5s", "--node-ttl", "0"},
			[]string{"node-ttl: 3s must be longer than node-heartbeat 5s"}},
		{[]string{"server", "--id", "s1", "--data", "/nonexistent/x", "--api", "127.0.0.1:0", "--raft", "127.0.0.1:2", "--heartbeat-timeout", "2s"},
			[]string{"election-timeout: 1s must be at least heartbeat-timeout 2s"}},
		{[]string{"server", "--id", "s1", "--data", "/nonexistent/x", "--api", "127.0.0.1:0", "--raft", "127.0.0.1:2", "--heartbeat-timeout", "1ms", "--snapshot-interval", "1ms", "--node-heartbeat", "1ns"},
			[]string{"heartbeat-timeout: 1ms is under raft's minimum of 5ms", "snapshot-interval: 1ms is under raft's minimum", "node-heartbeat: 1ns is under 1ms"}},
		{[]string{"server", "--id", "s2", "--data", "/nonexistent/x", "--api", "127.0.0.1:0", "--raft", "127.0.0.1:2", "--join", "127.0.0.1:7480"},
			[]string{`join: "127.0.0.1:7480" must be a URL starting with http:// or https://`}},
		{[]string{"bench"}, []string{`the only benchmark here is "capacity"`}},
		{[]string{"bench", "capacity", "--preset", "huge"}, []string{`preset: "huge" is not default or ci`}},
		{[]string{"bench", "capacity", "--finish", "later"}, []string{`finish: "later" is not run or cancel`}},
		{[]string{"bench", "capacity", "--fleet-nice", "20"}, []string{"fleet-nice: 20 is over 19"}},
		{[]string{"bench", "capacity", "--time-scale", "NaN", "--steady", "-1s", "--check-logs", "-2", "--timeout", "-1m", "--fleet-nice", "-3"},
			[]string{"time-scale: NaN must be a positive number", "steady: -1s must not be negative", "check-logs: -2 must be", "timeout: -1m0s must not be negative", "fleet-nice: -3 must be 0 to 19"}},
		{[]string{"bench", "capacity", "--nodes", "7", "--nodes-per-process", "5"}, []string{"nodes: 7 is not a multiple of nodes-per-process 5"}},
	} {
		var out, errOut bytes.Buffer
		err := run(c.args, &out, &errOut)
		if err == nil {
			t.Errorf("warren %s: no error", strings.Join(c.args, " "))
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("warren %s: error %q does not say %q", strings.Join(c.args, " "), err, w)
			}
		}
	}
}

// FuzzParseCapacity: any --capacity or --labels text is parsed or refused
// with an error, never a panic, and a parsed capacity is positive.
func FuzzParseCapacity(f *testing.F) {
	for _, s := range []string{"", "cpu=2,mem=4GiB", "cpu=0.5", "mem=512MiB", "mem=1.5T", "cpu=", "=", ",,", "cpu=1e400", "cpu=NaN", "cpu=0.0001", "mem=NaN", "mem=NaNG", "mem=-1G", "mem=9999999999T", "a=b,c=d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if r, err := parseCapacity(s); err == nil && (r.GetMilliCpu() <= 0 || r.GetMemoryBytes() <= 0) {
			t.Fatalf("parseCapacity(%q) = %v without an error", s, r)
		}
		_, _ = parseLabels(s)
	})
}

// Guests stop their tick while idle unless --tcg-tickless-idle=false, and
// have RDRAND unless --tcg-rdrand=false (the fields are the inverses, so
// warren dev, whose flag set lacks the flags, gets the same defaults from
// the zero value).
func TestInvertedTCGFlags(t *testing.T) {
	for name, off := range map[string]func(*nodeFlags) bool{
		"tcg-tickless-idle": func(f *nodeFlags) bool { return f.tcgPeriodicTick },
		"tcg-rdrand":        func(f *nodeFlags) bool { return f.tcgNoRDRAND },
	} {
		for _, c := range []struct {
			args []string
			off  bool
		}{{nil, false}, {[]string{"--" + name}, false}, {[]string{"--" + name + "=true"}, false}, {[]string{"--" + name + "=false"}, true}} {
			var f nodeFlags
			fs := flag.NewFlagSet("node", flag.ContinueOnError)
			f.register(fs)
			if err := fs.Parse(c.args); err != nil {
				t.Fatalf("%v: %v", c.args, err)
			}
			if off(&f) != c.off {
				t.Errorf("%v: inverse field %v, want %v", c.args, off(&f), c.off)
			}
		}
		fs := flag.NewFlagSet("node", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		new(nodeFlags).register(fs)
		if err := fs.Parse([]string{"--" + name + "=sometimes"}); err == nil {
			t.Errorf("--%s=sometimes was accepted", name)
		}
	}
}
