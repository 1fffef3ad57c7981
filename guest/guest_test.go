package guest

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/goleak"
)

type fakeSys struct {
	mu        sync.Mutex
	now       int64
	entropy   []byte
	hostname  string
	net       *NetConfig
	netCalls  int
	pids      int
	pidsCalls int
	strays    int // KillStrays calls
	// setTimeDelay slows SetTime (a claim's first step); hostnameErr fails
	// SetHostname; netErr fails SetNetwork.
	setTimeDelay time.Duration
	hostnameErr  error
	netErr       error
}

func (f *fakeSys) SetTime(ns int64) error {
	time.Sleep(f.setTimeDelay)
	f.mu.Lock()
	f.now = ns
	f.mu.Unlock()
	return nil
}
func (f *fakeSys) AddEntropy(b []byte) error {
	f.mu.Lock()
	f.entropy = append([]byte(nil), b...)
	f.mu.Unlock()
	return nil
}
func (f *fakeSys) SetHostname(n string) error {
	if f.hostnameErr != nil {
		return f.hostnameErr
	}
	f.mu.Lock()
	f.hostname = n
	f.mu.Unlock()
	return nil
}
func (f *fakeSys) SetNetwork(c NetConfig) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.netCalls++
	if f.netErr != nil {
		return f.netErr
	}
	f.net = &c
	return nil
}
func (f *fakeSys) SetPids(n int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pidsCalls++
	f.pids = n
	return nil
}
func (f *fakeSys) Stats() (Stats, error)          { return Stats{Procs: 7}, nil }
func (f *fakeSys) ExecAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
func (f *fakeSys) KillStrays() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.strays++
	return nil
}

// pair runs a Server on one end of a pipe and returns a Client on the
// other, speaking the wire codec from its first call, as a clone's host
// does (TestClientLearnsTheWireCodec covers JSON).
func pair(t *testing.T, sys System) *Client {
	t.Helper()
	c := pairJSON(t, sys)
	c.UseWire()
	return c
}

// pairJSON is pair with a Client that has not learnt the wire codec.
func pairJSON(t *testing.T, sys System) *Client {
	t.Helper()
	a, b := net.Pipe()
	srv := &Server{Sys: sys}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(b) }()
	c, err := NewClient(a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); <-done })
	return c
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestExecStreamsOutputAndExitCode(t *testing.T) {
	c := pair(t, &fakeSys{})
	var out, errb bytes.Buffer
	res, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c", "echo $((6*7)); echo oops >&2; echo $FOO; exit 3"},
		Env: map[string]string{"FOO": "bar"}}, &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || out.String() != "42\nbar\n" || errb.String() != "oops\n" {
		t.Fatalf("exit %d stdout %q stderr %q", res.ExitCode, out.String(), errb.String())
	}
}

func TestExecStdinAndDir(t *testing.T) {
	c := pair(t, &fakeSys{})
	dir := t.TempDir()
	var out bytes.Buffer
	res, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c", "pwd; tr a-z A-Z"}, Dir: dir,
		Stdin: strings.NewReader("hello\n")}, &out, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatal(res, err)
	}
	if want := dir + "\nHELLO\n"; out.String() != want {
		t.Fatalf("got %q want %q", out.String(), want)
	}
}

// A timeout kills the whole process group, background children included.
func TestExecTimeoutKillsGroup(t *testing.T) {
	c := pair(t, &fakeSys{})
	pidFile := filepath.Join(t.TempDir(), "pid")
	res, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c", "sleep 30 & echo $! > " + pidFile + "; wait"},
		Timeout: 300 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || res.Signal != int(syscall.SIGKILL) {
		t.Fatalf("result %+v, want timed out by SIGKILL", res)
	}
	assertGone(t, pidFile)
}

// Cancelling the caller's context kills the command's group.
func TestExecCancelKillsGroup(t *testing.T) {
	c := pair(t, &fakeSys{})
	pidFile := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for range 200 {
			if b, _ := os.ReadFile(pidFile); len(b) > 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}()
	_, err := c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "sleep 30 & echo $! > " + pidFile + "; wait"}}, nil, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	assertGone(t, pidFile)
}

func assertGone(t *testing.T, pidFile string) {
	t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	for _, ch := range strings.TrimSpace(string(b)) {
		pid = pid*10 + int(ch-'0')
	}
	for range 300 {
		// A killed child may linger as a zombie until its parent reaps it.
		st, err := os.ReadFile("/proc/" + strings.TrimSpace(string(b)) + "/stat")
		if err != nil || strings.Contains(string(st), ") Z ") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("background child %d still runs", pid)
}

func TestFiles(t *testing.T) {
	c := pair(t, &fakeSys{})
	ctx := context.Background()
	dir := t.TempDir()
	p := filepath.Join(dir, "a", "b.txt")
	big := bytes.Repeat([]byte("x"), 3*MaxFrame+17)
	fi, err := c.WriteFile(ctx, p, new(uint32(0o600)), bytes.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size != int64(len(big)) || os.FileMode(fi.Mode).Perm() != 0o600 {
		t.Fatalf("info %+v", fi)
	}
	var got bytes.Buffer
	if _, err := c.ReadFile(ctx, p, 0, &got); err != nil || !bytes.Equal(got.Bytes(), big) {
		t.Fatalf("read back %d bytes, err %v", got.Len(), err)
	}
	if _, err := c.ReadFile(ctx, p, 10, &got); err == nil || !strings.Contains(err.Error(), "over the limit") {
		t.Fatalf("limit: err %v", err)
	}
	ls, err := c.List(ctx, filepath.Join(dir, "a"))
	if err != nil || len(ls) != 1 || ls[0].Name != "b.txt" {
		t.Fatalf("list %+v %v", ls, err)
	}
	if st, err := c.Stat(ctx, dir); err != nil || !st.Dir {
		t.Fatalf("stat %+v %v", st, err)
	}
	if _, err := c.Stat(ctx, filepath.Join(dir, "missing")); err == nil {
		t.Fatal("stat of a missing file succeeded")
	}
}

func TestBadInputNamesTheField(t *testing.T) {
	c := pair(t, &fakeSys{})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"relative", func() error { _, err := c.Stat(ctx, "etc/passwd"); return err }(), "must be absolute"},
		{"dotdot", func() error { _, err := c.List(ctx, "/tmp/../etc"); return err }(), `".."`},
		{"nul", func() error { _, err := c.Stat(ctx, "/tmp/\x00"); return err }(), "NUL"},
		{"long path", func() error { _, err := c.Stat(ctx, "/"+strings.Repeat("a", MaxPathBytes)); return err }(), "over the limit"},
		// ENAMETOOLONG from a rename would name the agent's temporary file.
		{"long element", func() error {
			_, err := c.WriteFile(ctx, filepath.Join(t.TempDir(), strings.Repeat("a", MaxNameBytes+1)), nil, strings.NewReader("x"))
			return err
		}(), "path: an element of 256 bytes, over the limit of 255"},
		// fork/exec says the program is missing when the directory is.
		{"missing dir", func() error {
			_, err := c.Exec(ctx, ExecRequest{Argv: []string{"true"}, Dir: "/nonexistent-dir"}, nil, nil)
			return err
		}(), "dir /nonexistent-dir: no such file or directory"},
		{"dir not a directory", func() error {
			_, err := c.Exec(ctx, ExecRequest{Argv: []string{"true"}, Dir: "/etc/passwd"}, nil, nil)
			return err
		}(), "dir /etc/passwd: not a directory"},
		{"empty command", func() error { _, err := c.Exec(ctx, ExecRequest{}, nil, nil); return err }(), "command: required"},
		{"huge command", func() error {
			_, err := c.Exec(ctx, ExecRequest{Argv: []string{"echo", strings.Repeat("a", MaxCommandBytes)}}, nil, nil)
			return err
		}(), "over the limit"},
		{"bad env", func() error {
			_, err := c.Exec(ctx, ExecRequest{Argv: []string{"true"}, Env: map[string]string{"A=B": "c"}}, nil, nil)
			return err
		}(), "env"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: err %v, want it to mention %q", tc.name, tc.err, tc.want)
		}
	}
	// The guest checks too: a request that skips the client's checks.
	st, err := c.sess.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	cl := &call{st: st, stop: func() bool { return true }, ctx: ctx}
	if err := writeJSON(st, frameRequest, &Request{Op: OpRead, Path: "../x"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.finish(cl, nil); err == nil || !strings.Contains(err.Error(), "must be absolute") {
		t.Fatalf("guest-side check: %v", err)
	}
}

func TestClaimSetsIdentity(t *testing.T) {
	sys := &fakeSys{}
	c := pair(t, sys)
	now := time.Unix(1_800_000_000, 5)
	if _, err := c.Claim(context.Background(), ClaimRequest{Now: now, Entropy: []byte{1, 2, 3}, Hostname: "sb-1",
		Env: map[string]string{"SANDBOX_ID": "sb-1"}}); err != nil {
		t.Fatal(err)
	}
	sys.mu.Lock()
	if sys.now != now.UnixNano() || !bytes.Equal(sys.entropy, []byte{1, 2, 3}) || sys.hostname != "sb-1" {
		t.Errorf("system after claim: %+v", sys)
	}
	sys.mu.Unlock()
	out, _, err := c.Output(context.Background(), "sh", "-c", "echo $SANDBOX_ID")
	if err != nil || string(out) != "sb-1\n" {
		t.Fatalf("claim env: %q %v", out, err)
	}
}

// A claim without a time leaves the guest's clock alone (the zero time is
// not sent as a time far in the past).
func TestClaimWithoutATimeKeepsTheClock(t *testing.T) {
	sys := &fakeSys{}
	c := pair(t, sys)
	if _, err := c.Claim(context.Background(), ClaimRequest{Hostname: "sb-2"}); err != nil {
		t.Fatal(err)
	}
	sys.mu.Lock()
	defer sys.mu.Unlock()
	if sys.now != 0 || sys.hostname != "sb-2" {
		t.Errorf("system after a claim without a time: now %d hostname %q", sys.now, sys.hostname)
	}
}

// A claim sets the network only when its settings differ from those the
// last claim set: a snapshot's clones send the settings their snapshot set.
// A failed attempt is made again in full.
func TestClaimSkipsTheNetworkItSetAlready(t *testing.T) {
	sys := &fakeSys{}
	c := pair(t, sys)
	ctx := context.Background()
	a := NetConfig{Iface: "eth0", Addrs: []string{"169.254.77.2/30"}, Gateways: []string{"169.254.77.1"}, DNS: []string{"10.213.0.1"}}
	b := a.clone()
	b.DNS = []string{"10.213.0.5"}
	claim := func(nc NetConfig) error {
		_, err := c.Claim(ctx, ClaimRequest{Now: time.Now(), Net: &nc})
		return err
	}
	calls := func() int { sys.mu.Lock(); defer sys.mu.Unlock(); return sys.netCalls }
	for i, step := range []struct {
		nc    NetConfig
		fail  bool
		calls int
	}{
		{a, false, 1}, {a, false, 1}, {b, false, 2}, {a, false, 3}, {b, true, 4}, {b, false, 5}, {b, false, 5},
	} {
		sys.mu.Lock()
		sys.netErr = nil
		if step.fail {
			sys.netErr = errors.New("no netlink today")
		}
		sys.mu.Unlock()
		if err := claim(step.nc); (err != nil) != step.fail {
			t.Fatalf("claim %d: %v", i, err)
		}
		if n := calls(); n != step.calls {
			t.Fatalf("after claim %d: SetNetwork ran %d times, want %d", i, n, step.calls)
		}
	}
	sys.mu.Lock()
	got := *sys.net
	sys.mu.Unlock()
	if !got.Equal(b) {
		t.Errorf("network set: %+v, want %+v", got, b)
	}
}

// Likewise the process limit: a snapshot sets the default one.
func TestClaimSkipsTheProcessLimitItSetAlready(t *testing.T) {
	sys := &fakeSys{}
	c := pair(t, sys)
	for i, step := range []struct{ pids, calls, want int }{
		{4096, 1, 4096}, {4096, 1, 4096}, {0, 1, 4096}, {64, 2, 64}, {4096, 3, 4096},
	} {
		if _, err := c.Claim(context.Background(), ClaimRequest{Now: time.Now(), Pids: step.pids}); err != nil {
			t.Fatal(err)
		}
		sys.mu.Lock()
		calls, pids := sys.pidsCalls, sys.pids
		sys.mu.Unlock()
		if calls != step.calls || pids != step.want {
			t.Fatalf("after claim %d (pids %d): SetPids ran %d times, limit %d; want %d times, %d", i, step.pids, calls, pids, step.calls, step.want)
		}
	}
}

// A command sent right behind a claim, without waiting for its answer,
// runs with the claimed identity: the agent serves a claim before it
// accepts the next call. (Served concurrently, the command would start
// while the slow claim is still setting the clock, with no SANDBOX_ID.)
func TestCallsBehindAClaimSeeItsIdentity(t *testing.T) {
	c := pair(t, &fakeSys{setTimeDelay: 200 * time.Millisecond})
	ctx := context.Background()
	if c.Ordered() {
		t.Fatal("ordered before any answer")
	}
	wait, err := c.StartClaim(ctx, ClaimRequest{Now: time.Now(), Hostname: "sb-2", Env: map[string]string{"SANDBOX_ID": "sb-2"}})
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := c.Output(ctx, "sh", "-c", "echo $SANDBOX_ID")
	if err != nil || string(out) != "sb-2\n" {
		t.Fatalf("command behind the claim: %q %v", out, err)
	}
	if _, err := wait(); err != nil || !c.Ordered() {
		t.Fatalf("claim: ordered %v, err %v", c.Ordered(), err)
	}
	// A ping says so too (the host learns it before its first claim).
	c2 := pair(t, &fakeSys{})
	if _, err := c2.Ping(ctx); err != nil || !c2.Ordered() {
		t.Fatalf("after a ping: ordered %v, err %v", c2.Ordered(), err)
	}
}

// A failed claim leaves the sandbox without its identity, so calls behind
// it are refused with the reason, until a claim succeeds.
func TestCallsBehindAFailedClaimAreRefused(t *testing.T) {
	sys := &fakeSys{hostnameErr: errors.New("no hostname today")}
	c := pair(t, sys)
	ctx := context.Background()
	wait, err := c.StartClaim(ctx, ClaimRequest{Now: time.Now(), Hostname: "sb-3"})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = c.Output(ctx, "true")
	if err == nil || !strings.Contains(err.Error(), "claim failed") || !strings.Contains(err.Error(), "no hostname today") {
		t.Fatalf("command behind a failed claim: %v", err)
	}
	if _, err := wait(); err == nil {
		t.Fatal("the claim did not fail")
	}
	if _, err := c.Ping(ctx); err != nil {
		t.Fatalf("ping after a failed claim: %v", err)
	}
	sys.hostnameErr = nil // no call is running: the claim was answered
	if _, err := c.Claim(ctx, ClaimRequest{Now: time.Now(), Hostname: "sb-3"}); err != nil {
		t.Fatal(err)
	}
	if _, res, err := c.Output(ctx, "true"); err != nil || res.ExitCode != 0 {
		t.Fatalf("command after a good claim: %+v %v", res, err)
	}
}

func TestManyConcurrentCalls(t *testing.T) {
	c := pair(t, &fakeSys{})
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, res, err := c.Output(context.Background(), "sh", "-c", "sleep 0.2; echo "+strings.Repeat("y", i))
			if err != nil || res.ExitCode != 0 || len(out) != i+1 {
				errs <- errors.New("call failed: " + string(out))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestParseCmdline(t *testing.T) {
	c, err := ParseCmdline("console=ttyS0 warren.pids=64 warren.root=/dev/vdb warren.probe=1")
	if err != nil || c.Pids != 64 || c.Root != "/dev/vdb" || !c.Probe || c.ReserveMB != 32 {
		t.Fatalf("%+v %v", c, err)
	}
	if _, err := ParseCmdline("warren.pids=many"); err == nil || !strings.Contains(err.Error(), "warren.pids") {
		t.Fatalf("bad value: %v", err)
	}
}

// FuzzServer feeds arbitrary bytes to the agent as one call: it must answer
// or hang up, never crash.
func FuzzServer(f *testing.F) {
	f.Add([]byte("q\x00\x00\x00\x0d{\"op\":\"ping\"}"))
	f.Add([]byte("q\x00\x00\x00\x1c{\"op\":\"stat\",\"path\":\"/tmp\"}"))
	f.Add([]byte("q\x00\x00\x00\x1c{\"op\":\"list\",\"path\":\"../x\"}"))
	f.Add([]byte("d\xff\xff\xff\xff"))
	f.Add(append([]byte("Q\x00\x00\x00\x06"), (&Request{Op: OpPing}).appendWire(nil)...))
	f.Add(append([]byte("Q\x00\x00\x00\x0c"), (&Request{Op: OpStat, Path: "/tmp"}).appendWire(nil)...))
	f.Fuzz(func(t *testing.T, in []byte) {
		if bytes.Contains(in, []byte("exec")) || bytes.Contains(in, []byte("write")) || bytes.Contains(in, []byte("claim")) || bytes.Contains(in, []byte("sync")) {
			return // those act on the host running the fuzzer
		}
		a, b := net.Pipe()
		srv := &Server{Sys: &fakeSys{}}
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(b) }()
		c, err := NewClient(a)
		if err != nil {
			t.Fatal(err)
		}
		st, err := c.sess.OpenStream()
		if err == nil {
			_, _ = st.Write(in)
			_ = st.Close()
			buf := make([]byte, 4096)
			_ = st.SetReadDeadline(time.Now().Add(time.Second))
			for {
				if _, err := st.Read(buf); err != nil {
					break
				}
			}
		}
		c.Close()
		<-done
	})
}

// A guest that takes calls but never answers: the caller's deadline still
// ends the call at once (not after yamux's one-minute stream close timeout).
func TestCallEndsAtDeadlineWhenGuestIsSilent(t *testing.T) {
	a, b := net.Pipe()
	c, err := NewClient(a)
	if err != nil {
		t.Fatal(err)
	}
	silent, err := yamux.Server(b, YamuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			if _, err := silent.AcceptStream(); err != nil {
				return // the streams stay open and unanswered
			}
		}
	}()
	defer silent.Close()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err = c.Ping(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ping of a silent guest: %v, want the deadline", err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("ping returned %v after its 100ms deadline", d)
	}
}
