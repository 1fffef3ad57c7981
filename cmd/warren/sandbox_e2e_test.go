package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/internal/freeaddr"
	"github.com/warrenhq/warren/internal/testenv"
	"github.com/warrenhq/warren/noded/driver/microvm"
)

// TestSandboxCLI is the sandbox API's acceptance through the CLI against a
// real microVM node (warren dev --driver microvm): create, exec with exit
// codes, cp both ways, pause and resume keep files, rm leaves nothing, and
// bad input gets errors naming the field. It needs root, QEMU and the
// default template (`make image`).
func TestSandboxCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("boots microVMs")
	}
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root (cgroups)")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		testenv.Missing(t, "needs qemu-system-x86 (apt-get install qemu-system-x86 qemu-utils)")
	}
	imageDir := os.Getenv("WARREN_IMAGE_DIR")
	if imageDir == "" {
		imageDir = microvm.DefaultImageDir
	}
	if _, err := guest.LoadTemplate(imageDir, "default"); err != nil {
		testenv.Missing(t, "needs the default template: %v (run `make image`)", err)
	}
	api := freeaddr.Loopback(t)
	host, port, _ := net.SplitHostPort(api)
	if p, _ := strconv.Atoi(port); p >= 65534 {
		t.Skip("no room for the raft port")
	}
	data := filepath.Join(t.TempDir(), "dev")
	logPath := filepath.Join(t.TempDir(), "dev.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	devLog := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	dev := exec.Command(warrenBin, "dev", "--driver", "microvm", "--image-dir", imageDir, "--data", data, "--api", api, "--raft", freeaddr.Loopback(t), "--log-level", "warn")
	dev.Stdout, dev.Stderr = logFile, logFile
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			dev.Process.Signal(os.Interrupt)
			dev.Wait()
		}
	}
	t.Cleanup(stop)
	server := "--server=http://" + net.JoinHostPort(host, port)
	run := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(warrenBin, append(append([]string{}, args[:2]...), append([]string{server}, args[2:]...)...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		code := 0
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		out, _, code := run("nodes", "list")
		if code == 0 && strings.Contains(out, "microvm") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("warren dev did not serve a microvm node in 90s; its log:\n%s", devLog())
		}
		time.Sleep(200 * time.Millisecond)
	}

	out, stderr, code := run("sandbox", "create", "-o", "json")
	if code != 0 {
		t.Fatalf("create: %s\n%s", stderr, devLog())
	}
	var sb struct {
		ID    string `json:"id"`
		Start string `json:"start"`
	}
	if err := json.Unmarshal([]byte(out), &sb); err != nil || sb.ID == "" {
		t.Fatalf("create -o json printed %q: %v", out, err)
	}
	t.Logf("sandbox %s (%s)", sb.ID, sb.Start)
	// Egress: on by default (root), the registries profile; a live change.
	egressOf := func(out string) string {
		var v struct {
			Egress struct {
				Profile string   `json:"profile"`
				Allow   []string `json:"allow"`
			} `json:"egress"`
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			return fmt.Sprintf("%q: %v", out, err)
		}
		return v.Egress.Profile + " " + strings.Join(v.Egress.Allow, ",")
	}
	if got := egressOf(out); got != "registries " {
		t.Errorf("create: egress %s, want the registries profile in %s", got, out)
	}
	if out, stderr, code = run("sandbox", "egress", sb.ID, "--egress-profile", "custom", "--egress-allow", "example.org,*.pkg.dev", "-o", "json"); code != 0 ||
		egressOf(out) != "custom example.org,*.pkg.dev" {
		t.Fatalf("sandbox egress: exit %d %s %s", code, out, stderr)
	}
	if out, _, _ = run("sandbox", "get", sb.ID); !strings.Contains(out, "custom+2") {
		t.Errorf("get: want egress custom+2 in %s", out)
	}

	out, stderr, code = run("sandbox", "exec", sb.ID, "--", "sh", "-c", "uname -a; echo $((6*7))")
	if code != 0 || !strings.Contains(out, "Linux") || !strings.HasSuffix(out, "\n42\n") {
		t.Fatalf("exec: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	if out, stderr, code = run("sandbox", "exec", sb.ID, "--", "sh", "-c", "echo to-err >&2; exit 7"); code != 7 || stderr != "to-err\n" {
		t.Fatalf("exec exit code: %d, stdout %q, stderr %q", code, out, stderr)
	}

	local := filepath.Join(t.TempDir(), "in.txt")
	os.WriteFile(local, []byte("written from the host\n"), 0o600)
	if _, stderr, code = run("sandbox", "cp", local, sb.ID+":/work/in.txt"); code != 0 {
		t.Fatalf("cp in: %s", stderr)
	}
	if out, _, _ = run("sandbox", "exec", sb.ID, "--", "cat", "/work/in.txt"); out != "written from the host\n" {
		t.Fatalf("file in the guest: %q", out)
	}
	run("sandbox", "exec", sb.ID, "--", "sh", "-c", "echo made inside > /work/out.txt")
	back := filepath.Join(t.TempDir(), "out.txt")
	if _, stderr, code = run("sandbox", "cp", sb.ID+":/work/out.txt", back); code != 0 {
		t.Fatalf("cp out: %s", stderr)
	}
	if b, _ := os.ReadFile(back); string(b) != "made inside\n" {
		t.Fatalf("copied out %q", b)
	}

	if _, stderr, code = run("sandbox", "pause", sb.ID); code != 0 {
		t.Fatalf("pause: %s", stderr)
	}
	if out, _, _ = run("sandbox", "ls"); !strings.Contains(out, "paused") {
		t.Fatalf("ls after pause: %s", out)
	}
	if _, stderr, code = run("sandbox", "resume", sb.ID); code != 0 {
		t.Fatalf("resume: %s", stderr)
	}
	if out, _, _ = run("sandbox", "exec", sb.ID, "--", "cat", "/work/in.txt", "/work/out.txt"); out != "written from the host\nmade inside\n" {
		t.Fatalf("files after resume: %q", out)
	}

	// Bad input: each error names what is wrong.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sandbox", "create", "--template", "no-such-template"}, `template "no-such-template"`},
		{[]string{"sandbox", "create", "--vcpus", "4096"}, "limits.vcpus"},
		{[]string{"sandbox", "create", "--memory-mb", "99999999"}, "limits.memory_mb"},
		{[]string{"sandbox", "cp", sb.ID + ":../etc/passwd", "-"}, "must be absolute"},
		{[]string{"sandbox", "cp", sb.ID + ":/root/../../etc/shadow", "-"}, `".."`},
		{[]string{"sandbox", "exec", sb.ID, "--", "echo", strings.Repeat("x", 100<<10), strings.Repeat("y", 100<<10)}, "over the limit"},
		{[]string{"sandbox", "exec", "not-an-id", "--", "true"}, "sandbox_id"},
		{[]string{"sandbox", "exec", "--cmd-timeout", "9000h", sb.ID, "--", "true"}, "timeout_ms"},
		{[]string{"sandbox", "exec", "--cmd-timeout", "-1s", sb.ID, "--", "true"}, "--cmd-timeout"},
		{[]string{"sandbox", "create", "--egress-allow", "no spaces.org"}, "egress.allow[0]"},
		{[]string{"sandbox", "create", "--egress-prefix", "10.0.0.0/33"}, "egress.allow_prefixes[0]"},
		{[]string{"sandbox", "create", "--egress-profile", "open"}, "egress.profile"},
		{[]string{"sandbox", "egress", sb.ID, "--egress-profile", "none", "--egress-allow", "a.org"}, "allows nothing"},
		{[]string{"sandbox", "exec", "sb-0000000000-dev", "--", "true"}, "not found"},
	} {
		_, stderr, code := run(tc.args...)
		if code == 0 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want it to mention %s", tc.args[:2], code, stderr, tc.want)
		}
	}

	// Pool targets: set cluster-wide, shown per node.
	if out, stderr, code = run("pool", "set", "default", "1"); code != 0 || !strings.Contains(out, "default") {
		t.Fatalf("pool set: %s %s", out, stderr)
	}
	// The pool needs the template's snapshot first: a TCG boot and warm-up
	// that takes seconds on an idle machine and minutes while the rest of
	// the suite runs on the same two cores.
	var pools string
	poolDeadline := time.Now().Add(5 * time.Minute)
	for {
		pools, _, _ = run("pool", "list", "-o", "json")
		if strings.Contains(pools, `"target":1`) && strings.Contains(pools, `"ready":1`) {
			break
		}
		if time.Now().After(poolDeadline) {
			t.Fatalf("timed out after 5m waiting for the pool to fill; pool list: %s", pools)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, stderr, code = run("pool", "set", "default", "0"); code != 0 {
		t.Fatalf("pool set 0: %s", stderr)
	}

	vms := filepath.Join(data, "node", "microvm", "vms")
	vm := vmOf(t, vms, sb.ID)
	if _, stderr, code = run("sandbox", "rm", sb.ID); code != 0 {
		t.Fatalf("rm: %s", stderr)
	}
	if out, _, _ = run("sandbox", "ls"); strings.Contains(out, sb.ID) {
		t.Fatalf("ls after rm: %s", out)
	}
	// Nothing of it is left: no QEMU, no VM directory, no cgroup. The
	// node keeps its standby QEMU (launched ahead for cold claims; no
	// sandbox's), which says so in its meta.json.
	for _, cg := range []string{"/sys/fs/cgroup/warren/", "/sys/fs/cgroup/cpu/warren/", "/sys/fs/cgroup/memory/warren/", "/sys/fs/cgroup/pids/warren/"} {
		if _, err := os.Stat(cg + vm); err == nil {
			t.Errorf("the sandbox's cgroup %s is left after rm", cg+vm)
		}
	}
	standbys := standbyVMs(t, vms)
	t.Logf("standby QEMUs after rm: %d", len(standbys))
	if len(standbys) > microvm.DefaultStandbyQEMUs {
		t.Errorf("%d standby QEMUs, want at most %d", len(standbys), microvm.DefaultStandbyQEMUs)
	}
	// pool list counts them.
	if pools, _, _ = run("pool", "list", "-o", "json"); !strings.Contains(pools, fmt.Sprintf(`"standby":%d`, len(standbys))) && len(standbys) > 0 {
		t.Errorf("pool list with %d standby QEMUs: %s", len(standbys), pools)
	}
	if b, _ := exec.Command("pgrep", "-f", "-a", "qemu-system.*"+vms).Output(); len(b) > 0 {
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if !standbys[strings.TrimPrefix(regexp.MustCompile(`-name warren-(\S+)`).FindString(l), "-name warren-")] {
				t.Errorf("QEMU left running: %s", l)
			}
		}
	}
	stop()
	if b, _ := exec.Command("pgrep", "-f", "-a", "qemu-system.*"+filepath.Join(data, "node")).Output(); len(b) > 0 {
		t.Errorf("QEMU left running after the node stopped: %s", b)
	}
	// Nor a network namespace or link of the node's egress policy.
	tag := egressTag("dev", filepath.Join(data, "node"))
	if ents, _ := os.ReadDir("/run/netns"); len(ents) > 0 {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "warren-"+tag+"-") {
				t.Errorf("network namespace %s left after the node stopped", e.Name())
			}
		}
	}
	links, _ := os.ReadDir("/sys/class/net")
	for _, l := range links {
		if strings.HasPrefix(l.Name(), "w"+tag+"-") {
			t.Errorf("link %s of the node's egress policy left after it stopped", l.Name())
		}
	}
}

// vmOf returns the id of the VM (its directory in vms) that holds sandbox
// id, failing the test if there is none.
func vmOf(t *testing.T, vms, id string) string {
	t.Helper()
	ents, _ := os.ReadDir(vms)
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(vms, e.Name(), "meta.json"))
		var m struct {
			SandboxID string `json:"sandbox_id"`
		}
		if json.Unmarshal(b, &m) == nil && m.SandboxID == id {
			if _, err := os.Stat("/sys/fs/cgroup/warren/" + e.Name()); err != nil {
				if _, err1 := os.Stat("/sys/fs/cgroup/memory/warren/" + e.Name()); err1 != nil {
					t.Fatalf("sandbox %s's VM %s has no cgroup to check: %v", id, e.Name(), err)
				}
			}
			return e.Name()
		}
	}
	t.Fatalf("no VM in %s holds sandbox %s", vms, id)
	return ""
}

// standbyVMs returns the VM directories in vms that are standby QEMUs,
// and fails the test for any other. A standby being launched has no
// meta.json yet for a moment, so this waits up to 10 s for one.
func standbyVMs(t *testing.T, vms string) map[string]bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		standby, others := map[string]bool{}, []string(nil)
		ents, _ := os.ReadDir(vms)
		for _, e := range ents {
			b, _ := os.ReadFile(filepath.Join(vms, e.Name(), "meta.json"))
			var m struct {
				State     string `json:"state"`
				SandboxID string `json:"sandbox_id"`
			}
			if json.Unmarshal(b, &m) == nil && m.State == "standby" && m.SandboxID == "" {
				standby[e.Name()] = true
			} else {
				others = append(others, fmt.Sprintf("%s (%s)", e.Name(), b))
			}
		}
		if len(others) == 0 {
			return standby
		}
		if time.Now().After(deadline) {
			t.Errorf("VM directories left in %s: %v", vms, others)
			return standby
		}
		time.Sleep(50 * time.Millisecond)
	}
}
