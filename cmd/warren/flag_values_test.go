package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

// Client flags whose values would make every call fail with a message
// that does not say why (a bare deadline_exceeded, "unavailable") are
// refused naming the flag, before any call.
func TestClientFlagValuesNamed(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"cluster", "status", "--server", "http://127.0.0.1:1", "--timeout", "-1s"}, "--timeout -1s: must be positive"},
		{[]string{"cluster", "status", "--server", "http://127.0.0.1:1", "--timeout", "0"}, "--timeout 0s: must be positive"},
		{[]string{"cluster", "status", "--server", "http://"}, `--server "http://": no host`},
		{[]string{"cluster", "status", "--server", "http://:7480"}, `--server "http://:7480": no host`},
		{[]string{"cluster", "status", "--server", "http://127.0.0.1:99999"}, `--server "http://127.0.0.1:99999": port 99999 is not 1-65535`},
		{[]string{"cluster", "status", "--server", "http://127.0.0.1:7480,ftp://x"}, `--server "ftp://x": must start with http://`},
		{[]string{"task", "list", "--server", "http://127.0.0.1:0"}, "port 0 is not 1-65535"},
		{[]string{"sandbox", "exec", "s", "--timeout", "-1s", "--server", "http://127.0.0.1:1", "--", "true"}, "--timeout -1s: must not be negative"},
	} {
		var out, errb bytes.Buffer
		err := run(c.args, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("warren %s: %v, want %q", strings.Join(c.args, " "), err, c.want)
		}
	}
	// sandbox exec's --timeout 0 is no limit, and a URL without a port
	// is fine.
	for _, cf := range []clientFlags{
		{server: "http://127.0.0.1:1", output: "text", timeout: 0, noLimit: true},
		{server: "https://warren.example.com", output: "json", timeout: time.Second},
		{server: "http://[::1]:7480/,http://127.0.0.1:7481", output: "text", timeout: time.Second},
	} {
		if err := cf.check(); err != nil {
			t.Errorf("%+v: %v, want no error", cf, err)
		}
	}
}

// A bad value of a flag only some drivers use is refused naming the flag
// whichever driver is chosen, and then no driver is made.
func TestIgnoredFlagsStillValidated(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--driver", "sim", "--egress", "bogus"}, `egress: "bogus" is not on, off or auto`},
		{[]string{"--driver", "sim", "--egress", "of"}, `egress: "of" is not on, off or auto`},
		{[]string{"--driver", "sim", "--runtime", "kata"}, `runtime: "kata" is not runc or runsc`},
		{[]string{"--driver", "sim", "--accel", "hvf"}, `accel: "hvf" is not auto, kvm or tcg`},
		{[]string{"--driver", "sim", "--egress-pool", "-1"}, "egress-pool: -1 must be between 0 and 1024"},
		{[]string{"--driver", "sim", "--egress-prefix4", "10.0.0.0"}, "egress-prefix4"},
		{[]string{"--driver", "container", "--egress", "off", "--accel", "hvf"}, "accel"},
		{[]string{"--driver", "microvm", "--runtime", "kata"}, "runtime"},
		{[]string{"--driver", "docker"}, `driver: "docker" is not auto, microvm, container or sim`},
	} {
		cfg, err := parseNodeFlags(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("node %v: %v, want %q", c.args, err, c.want)
		}
		if _, ok := cfg.Driver.(noDriver); !ok {
			t.Errorf("node %v: a driver was made (%T) though a flag is wrong", c.args, cfg.Driver)
		}
	}
}

// `warren server --gossip` is checked with the other flags, before the
// data directory is bootstrapped.
func TestServerGossipAddrChecked(t *testing.T) {
	data := t.TempDir() + "/s1"
	var out, errb bytes.Buffer
	err := run([]string{"server", "--id", "s1", "--data", data, "--api", "127.0.0.1:0", "--raft", "127.0.0.1:2",
		"--gossip", "bogus", "--bootstrap"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), `gossip: "bogus" is not HOST:PORT`) {
		t.Errorf("server --gossip bogus: %v, want the gossip flag named", err)
	}
	err = run([]string{"server", "--id", "s1", "--data", data, "--api", "127.0.0.1:0", "--raft", "127.0.0.1:2",
		"--gossip", "127.0.0.1:http"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), `port "http" is not 0-65535`) {
		t.Errorf("server --gossip 127.0.0.1:http: %v, want the gossip flag named", err)
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Errorf("the data directory was made: %v", err)
	}
}
