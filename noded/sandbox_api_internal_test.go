package noded

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/warrenhq/warren/api"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/noded/driver"
)

// A file whose name is not UTF-8 (any byte string is a Linux name) is
// listed with U+FFFD for its bad bytes: a proto3 string must be UTF-8,
// and such a name made the whole listing fail to marshal.
func TestFileNamesThatAreNotUTF8AreListed(t *testing.T) {
	p := fileProto(guest.FileInfo{Name: "caf\xe9.txt", Size: 3})
	if p.GetName() != "caf\uFFFD.txt" {
		t.Errorf("name %q", p.GetName())
	}
	if _, err := proto.Marshal(p); err != nil {
		t.Errorf("marshal: %v", err)
	}
}

// The tests below serve SandboxAPI over loopback HTTP with a fake driver
// whose sandboxes run a real guest agent (guest.Server) in this process,
// so exec, read, write and list go through the same guest client and
// agent code a VM uses.

// agentBox is a sandbox whose guest agent runs in this process.
type agentBox struct {
	driver.AgentCalls
	id string

	mu        sync.Mutex
	c         *guest.Client
	destroyed bool
}

func (b *agentBox) ID() string { return b.id }
func (b *agentBox) Warm() bool { return false }
func (b *agentBox) Destroy() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.destroyed {
		b.destroyed = true
		b.c.Close()
	}
	return nil
}
func (b *agentBox) Info() driver.Info {
	return driver.Info{ID: b.id, Template: "default@v1", State: "running", Start: driver.StartBoot}
}
func (b *agentBox) Pause(ctx context.Context) error  { return nil }
func (b *agentBox) Resume(ctx context.Context) error { return nil }

// agent mirrors the drivers' client(): a destroyed sandbox says so.
func (b *agentBox) agent() (*guest.Client, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.destroyed {
		return nil, driver.Errorf(driver.ErrNotFound, "sandbox %s is destroyed", b.id)
	}
	return b.c, nil
}

// callErr mirrors the drivers' too: a call that a destroy cut off says
// so, not the channel's "guest: EOF".
func (b *agentBox) callErr(err error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.destroyed {
		return driver.Errorf(driver.ErrNotFound, "sandbox %s was destroyed while the call ran", b.id)
	}
	return err
}

func newAgentBox(t *testing.T, id string) *agentBox {
	t.Helper()
	a, b := net.Pipe()
	srv := &guest.Server{}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(b) }()
	c, err := guest.NewClient(a)
	if err != nil {
		t.Fatal(err)
	}
	box := &agentBox{id: id, c: c}
	box.Agent, box.CallErr = box.agent, box.callErr
	t.Cleanup(func() { _ = box.Destroy(); <-done })
	return box
}

// listDriver is a driver.Lister. It keeps no pools (not a driver.Pooler),
// as the container driver.
type listDriver struct {
	name string
	mu   sync.Mutex
	live map[string]driver.Sandbox
}

func (d *listDriver) Name() string              { return d.name }
func (d *listDriver) Accelerator() string       { return "" }
func (d *listDriver) SetPoolTarget(string, int) {}
func (d *listDriver) Close() error              { return nil }
func (d *listDriver) Claim(context.Context, driver.ClaimRequest) (driver.Sandbox, error) {
	return nil, errors.New("not in this fake")
}
func (d *listDriver) Sandboxes() []driver.Sandbox {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []driver.Sandbox
	for _, s := range d.live {
		out = append(out, s)
	}
	return out
}
func (d *listDriver) Get(id string) (driver.Sandbox, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.live[id]
	return s, ok
}

const testNode = "n1"

func serveSandboxAPI(t *testing.T, drv driver.Driver) warrenv1connect.SandboxServiceClient {
	t.Helper()
	hs := httptest.NewServer(sandboxHandler(NewSandboxAPI(testNode, t.TempDir(), drv, nil)))
	t.Cleanup(hs.Close)
	return warrenv1connect.NewSandboxServiceClient(hs.Client(), hs.URL)
}

// oneSandbox serves a node with one sandbox whose agent runs here.
func oneSandbox(t *testing.T) (warrenv1connect.SandboxServiceClient, *agentBox) {
	id := api.NewSandboxID(testNode)
	box := newAgentBox(t, id)
	drv := &listDriver{name: "microvm", live: map[string]driver.Sandbox{id: box}}
	return serveSandboxAPI(t, drv), box
}

// `warren sandbox cp ./notes.txt ID:/work/` (a directory, as with cp or
// docker cp) is refused as invalid_argument saying the path is a
// directory, without naming the agent's temporary file.
func TestWriteFileOntoADirectoryIsInvalid(t *testing.T) {
	c, box := oneSandbox(t)
	dir := t.TempDir()
	for _, p := range []string{dir, dir + "/"} {
		_, err := c.WriteFile(context.Background(), connect.NewRequest(&warrenv1.WriteFileRequest{SandboxId: box.id, Path: p, Data: []byte("hi")}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "is a directory") {
			t.Errorf("WriteFile %q: got %v; want invalid_argument saying the path is a directory", p, err)
		}
		if err != nil && strings.Contains(err.Error(), ".warren-write-") {
			t.Errorf("WriteFile %q: the error names the agent's temporary file: %v", p, err)
		}
	}
}

// WriteFile's mode reaches the guest set or unset: unset makes a 0644
// file, set to 0 a 0000 one (0 read as unset, so it made 0644).
func TestWriteFileKeepsModeZero(t *testing.T) {
	c, box := oneSandbox(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		mode *uint32
		want os.FileMode
	}{
		{"unset", nil, 0o644},
		{"zero", new(uint32(0)), 0},
		{"0750", new(uint32(0o750)), 0o750},
	} {
		p := filepath.Join(dir, tc.name)
		res, err := c.WriteFile(context.Background(), connect.NewRequest(&warrenv1.WriteFileRequest{SandboxId: box.id, Path: p, Data: []byte("hi"), Mode: tc.mode}))
		if err != nil {
			t.Fatalf("mode %s: %v", tc.name, err)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != tc.want || os.FileMode(res.Msg.GetFile().GetMode()).Perm() != tc.want {
			t.Errorf("mode %s: file has %v (answer says %v), want %v", tc.name, got, os.FileMode(res.Msg.GetFile().GetMode()).Perm(), tc.want)
		}
	}
}

// A sandbox destroyed (warren sandbox rm, or its TTL) while a command
// runs: the caller learns that the sandbox is gone (not_found), not a
// bare internal error with the guest transport's text.
func TestExecEndedByADestroySaysSo(t *testing.T) {
	c, box := oneSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := c.Exec(ctx, connect.NewRequest(&warrenv1.ExecRequest{SandboxId: box.id, Command: []string{"sh", "-c", "echo started; sleep 30"}}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() {
		t.Fatalf("no first message: %v", st.Err())
	}
	if _, err := c.DeleteSandbox(ctx, connect.NewRequest(&warrenv1.DeleteSandboxRequest{SandboxId: box.id})); err != nil {
		t.Fatal(err)
	}
	for st.Receive() {
	}
	if err := st.Err(); connect.CodeOf(err) != connect.CodeNotFound || !strings.Contains(err.Error(), "destroyed") {
		t.Errorf("exec of a sandbox destroyed meanwhile: %v; want not_found saying it was destroyed", err)
	}
}

// A program that cannot start is failed_precondition with the agent's
// reason: not_found is what a missing sandbox gets, and a client must
// tell the two apart by the code.
func TestExecOfAMissingProgramIsNotNotFound(t *testing.T) {
	c, box := oneSandbox(t)
	st, err := c.Exec(context.Background(), connect.NewRequest(&warrenv1.ExecRequest{SandboxId: box.id, Command: []string{"/nonexistent/prog"}}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for st.Receive() {
	}
	if err := st.Err(); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), `start "/nonexistent/prog"`) ||
		!strings.Contains(err.Error(), "no such file or directory") {
		t.Errorf("exec of a missing program: %v; want failed_precondition with the agent's message", err)
	}
}

// Every sandbox ListSandboxes shows is addressable by the other calls, or
// names the task whose actor owns it (id TASK-eEPOCH, on the driver the
// task actors share), which the sandbox calls refuse.
func TestListedSandboxesAreAddressableOrNameTheirTask(t *testing.T) {
	const task = "01JABCDEFGHJKMNPQRSTVWXYZ0"
	taskSB := newAgentBox(t, task+"-e1")
	apiSB := newAgentBox(t, api.NewSandboxID(testNode))
	drv := &listDriver{name: "microvm", live: map[string]driver.Sandbox{taskSB.id: taskSB, apiSB.id: apiSB}}
	c := serveSandboxAPI(t, drv)
	res, err := c.ListSandboxes(context.Background(), connect.NewRequest(&warrenv1.ListSandboxesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(res.Msg.GetSandboxes()); n != 2 {
		t.Fatalf("listed %d sandboxes, want 2", n)
	}
	for _, sb := range res.Msg.GetSandboxes() {
		_, err := c.GetSandbox(context.Background(), connect.NewRequest(&warrenv1.GetSandboxRequest{SandboxId: sb.GetId()}))
		switch sb.GetId() {
		case taskSB.id:
			if sb.GetTaskId() != task {
				t.Errorf("task sandbox %s listed with task %q, want %q", sb.GetId(), sb.GetTaskId(), task)
			}
		case apiSB.id:
			if err != nil || sb.GetTaskId() != "" {
				t.Errorf("sandbox %s (task %q) cannot be got: %v", sb.GetId(), sb.GetTaskId(), err)
			}
		}
	}
}

func TestSandboxTask(t *testing.T) {
	for id, want := range map[string]string{
		"01JABCDEFGHJKMNPQRSTVWXYZ0-e1":           "01JABCDEFGHJKMNPQRSTVWXYZ0",
		"01JABCDEFGHJKMNPQRSTVWXYZ0-e12":          "01JABCDEFGHJKMNPQRSTVWXYZ0",
		"sb-abcdefghij-n1":                        "",
		"sb-abcdefghij-node-e1":                   "",
		"01JABCDEFGHJKMNPQRSTVWXYZ0-ex":           "",
		"01JABCDEFGHJKMNPQRSTVWXYZ0-e":            "",
		"-e1":                                     "",
		"01JABCDEFGHJKMNPQRSTVWXYZ0-e3-verify-0":  "01JABCDEFGHJKMNPQRSTVWXYZ0",
		"01JABCDEFGHJKMNPQRSTVWXYZ0-e3-verify-12": "01JABCDEFGHJKMNPQRSTVWXYZ0",
		"01JABCDEFGHJKMNPQRSTVWXYZ0-e3-verify-":   "",
		"01JABCDEFGHJKMNPQRSTVWXYZ0-e3-verify-x":  "",
	} {
		if got := sandboxTask(id); got != want {
			t.Errorf("sandboxTask(%q) = %q, want %q", id, got, want)
		}
	}
}

// On a node whose driver keeps no warm pool (the container driver), a
// pool target is accepted as a no-op, and the answer says why: a
// cluster-wide `warren pool set` must not report the node as failing, nor
// say it "has no sandbox API".
func TestPoolSetOnADriverWithoutPoolsIsANoOp(t *testing.T) {
	c := serveSandboxAPI(t, &listDriver{name: "container", live: map[string]driver.Sandbox{}})
	res, err := c.SetPoolTarget(context.Background(), connect.NewRequest(&warrenv1.SetPoolTargetRequest{Template: "default", Target: 4}))
	if err != nil {
		t.Fatalf("pool set on a container node: %v", err)
	}
	ps := res.Msg.GetPools()
	if len(ps) != 1 || ps[0].GetNodeId() != testNode || ps[0].GetTemplate() != "default" || ps[0].GetTarget() != 0 ||
		ps[0].GetNote() != "the container driver keeps no warm pool" {
		t.Fatalf("pool set on a container node answered %v", ps)
	}
}

// poolDriver records the targets it is given (a driver.Pooler).
type poolDriver struct {
	listDriver
	targets map[string]int
	pools   []driver.PoolStatus
}

func (d *poolDriver) SetPoolTarget(t string, n int) { d.targets[t] = n }
func (d *poolDriver) Pools() []driver.PoolStatus    { return d.pools }

// A session's complete set of pool targets zeroes the templates the node
// has a target for and the set does not name (removed while the node was
// away; pools.json brought them back at start), and leaves the rest.
func TestCompletePoolTargetsZeroTheOthers(t *testing.T) {
	dir := t.TempDir()
	drv := &poolDriver{listDriver: listDriver{name: "microvm"}, targets: map[string]int{}}
	a := NewSandboxAPI(testNode, dir, drv, nil)
	for tpl, n := range map[string]int{"default": 4, "go": 2, "py": 1} {
		if err := a.setTarget(tpl, n, direct); err != nil {
			t.Fatal(err)
		}
	}
	// A restart restores them from pools.json.
	drv.targets = map[string]int{}
	a = NewSandboxAPI(testNode, dir, drv, nil)
	if drv.targets["default"] != 4 || drv.targets["go"] != 2 || drv.targets["py"] != 1 {
		t.Fatalf("restored targets %v", drv.targets)
	}
	a.setTargets([]*warrenv1.SetPoolTarget{{Template: "go", Target: 2}, {Template: "py", Target: 3}, {Template: "rust", Target: 1}}, 0)
	want := map[string]int{"default": 0, "go": 2, "py": 3, "rust": 1}
	for tpl, n := range want {
		if drv.targets[tpl] != n {
			t.Errorf("template %s: target %d, want %d (all: %v)", tpl, drv.targets[tpl], n, drv.targets)
		}
	}
	drv.targets = map[string]int{}
	NewSandboxAPI(testNode, dir, drv, nil)
	if _, ok := drv.targets["default"]; ok || drv.targets["py"] != 3 || drv.targets["rust"] != 1 {
		t.Errorf("saved targets after the complete set: %v", drv.targets)
	}
}

// A negative target in pools.json is ignored at start, not handed to the
// driver (the microvm driver's pool trim panicked on one).
func TestNegativeSavedPoolTargetIsIgnored(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pools.json"), []byte(`{"default":-1,"go":2}`), 0o644); err != nil {
		t.Fatal(err)
	}
	drv := &poolDriver{listDriver: listDriver{name: "microvm"}, targets: map[string]int{}}
	a := NewSandboxAPI(testNode, dir, drv, nil)
	if n, ok := drv.targets["default"]; ok {
		t.Errorf("the driver got default's saved target %d", n)
	}
	if drv.targets["go"] != 2 {
		t.Errorf("go's target %d, want 2 (all: %v)", drv.targets["go"], drv.targets)
	}
	if n, ok := a.pools["default"]; ok {
		t.Errorf("the API kept default's saved target %d", n)
	}
}

// A client that goes away mid-exec ends the command's process group
// (with a real agent behind the HTTP handler).
func TestExecClientGoneKillsCommand(t *testing.T) {
	c, box := oneSandbox(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithCancel(context.Background())
	st, err := c.Exec(ctx, connect.NewRequest(&warrenv1.ExecRequest{SandboxId: box.id,
		Command: []string{"sh", "-c", "echo $$ > " + pidFile + "; echo up; exec sleep 60"}}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() {
		t.Fatal(st.Err())
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	cancel()
	st.Close()
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("command %d still runs 10s after its client went away", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Large output streams in order and whole; stdin arrives whole.
func TestExecLargeOutputAndStdin(t *testing.T) {
	c, box := oneSandbox(t)
	in := bytes.Repeat([]byte("0123456789abcdef"), 256<<10) // 4 MiB
	st, err := c.Exec(context.Background(), connect.NewRequest(&warrenv1.ExecRequest{SandboxId: box.id,
		Command: []string{"sh", "-c", "cat; seq 1 200000 >&2; exit 7"}, Stdin: in}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var out, errb bytes.Buffer
	var code int32 = -1
	for st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *warrenv1.ExecResponse_Stdout:
			out.Write(ev.Stdout)
		case *warrenv1.ExecResponse_Stderr:
			errb.Write(ev.Stderr)
		case *warrenv1.ExecResponse_Exit:
			code = ev.Exit.GetCode()
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	for i := 1; i <= 200000; i++ {
		want.WriteString(strconv.Itoa(i) + "\n")
	}
	if !bytes.Equal(out.Bytes(), in) || !bytes.Equal(errb.Bytes(), want.Bytes()) || code != 7 {
		t.Fatalf("stdout %d bytes (want %d), stderr %d (want %d), exit %d", out.Len(), len(in), errb.Len(), want.Len(), code)
	}
}

// A pool target set directly (`warren pool set`, a SetPoolTarget call) is
// not undone by the leader's session targets that came before it and
// waited their turn (applyPoolsLater: a slow driver call ahead of them). They
// were read from the cluster's state earlier, and used to overwrite the
// newer target until the node's next session.
func TestDirectPoolTargetIsNotUndoneByAnOlderSessionTarget(t *testing.T) {
	drv := &poolDriver{listDriver: listDriver{name: "microvm", live: map[string]driver.Sandbox{}}, targets: map[string]int{}}
	dir := t.TempDir()
	a := NewSandboxAPI(testNode, dir, drv, nil)
	d := &Daemon{cfg: Config{ID: testNode, Driver: drv}, log: slog.New(slog.DiscardHandler), Sandboxes: a}
	gate := make(chan struct{})
	d.applyPoolsLater(func() { <-gate }) // a slow call ahead (a template loading)
	// The session opens: its targets, read from the cluster's state.
	old := []*warrenv1.SetPoolTarget{{Template: "default", Target: 1}, {Template: "go", Target: 2}}
	for _, p := range old {
		tpl, n, mark := p.GetTemplate(), int(p.GetTarget()), d.sessionMark()
		d.applyPoolsLater(func() { d.setPoolTarget(tpl, n, mark) })
	}
	mark := d.sessionMark()
	d.applyPoolsLater(func() { d.setPoolTargets(old, mark) })
	// Then an operator sets default to 5, directly.
	if _, err := a.SetPoolTarget(context.Background(), connect.NewRequest(&warrenv1.SetPoolTargetRequest{Template: "default", Target: 5})); err != nil {
		t.Fatal(err)
	}
	close(gate)
	d.wg.Wait()
	if drv.targets["default"] != 5 || drv.targets["go"] != 2 {
		t.Errorf("driver targets %v: want default at 5 (set directly, after the session's 1) and go at 2", drv.targets)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "pools.json"))
	if !strings.Contains(string(b), `"default":5`) {
		t.Errorf("pools.json %s: want default at 5", b)
	}
	// A later session's targets apply as before.
	mark = d.sessionMark()
	d.setPoolTargets([]*warrenv1.SetPoolTarget{{Template: "default", Target: 3}}, mark)
	if drv.targets["default"] != 3 || drv.targets["go"] != 0 {
		t.Errorf("after a later session's set: %v, want default 3 and go 0", drv.targets)
	}
}

// The driver's and the agent's errors map to the code a client acts on:
// a taken sandbox id is already_exists (not invalid_argument: the request
// is well formed), and a guest file the guest's modes refuse is
// permission_denied.
func TestCodeFor(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want connect.Code
	}{
		{driver.Errorf(driver.ErrExists, "sandbox %q exists", "sb-1"), connect.CodeAlreadyExists},
		{driver.Errorf(driver.ErrInvalid, "limits.pids 1"), connect.CodeInvalidArgument},
		{driver.Errorf(driver.ErrNotFound, "template x"), connect.CodeNotFound},
		{&guest.RemoteError{Msg: "open /etc/shadow: permission denied"}, connect.CodePermissionDenied},
		{&guest.RemoteError{Msg: `start "/tmp/x": fork/exec /tmp/x: permission denied`}, connect.CodeFailedPrecondition},
		{&guest.RemoteError{Msg: "open /x: no such file or directory"}, connect.CodeNotFound},
		{fmt.Errorf("guest: list /big: %w: the guest sent over 100000 entries", guest.ErrListTooLarge), connect.CodeFailedPrecondition},
	} {
		if got := codeFor(tc.err); got != tc.want {
			t.Errorf("codeFor(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// A pool's snapshot status that says why making one failed does not show
// the node's paths to clients (warren pool list), as no error does.
func TestPoolSnapshotStatusLeavesOutTheNodesPaths(t *testing.T) {
	drv := &poolDriver{listDriver: listDriver{name: "microvm"}, targets: map[string]int{}, pools: []driver.PoolStatus{{Template: "default",
		Snapshot: "making the snapshot failed: snapshot: stat /var/lib/warren/microvm/snapshots/default-v1-256m/mem: no such file or directory"}}}
	c := serveSandboxAPI(t, drv)
	res, err := c.ListPools(context.Background(), connect.NewRequest(&warrenv1.ListPoolsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	ps := res.Msg.GetPools()
	if len(ps) != 1 || strings.Contains(ps[0].GetSnapshot(), "/var/lib") || !strings.Contains(ps[0].GetSnapshot(), "…/mem: no such file") {
		t.Errorf("pool list: %v; want the snapshot's status without the node's paths", ps)
	}
}

// A request's lists are counted before it is decoded: 200,000 empty
// command arguments (400 KB, a few KB gzipped) are refused naming the
// field, not decoded into millions of strings first.
func TestSandboxListsAreCountedBeforeDecoding(t *testing.T) {
	hs := httptest.NewServer(sandboxHandler(NewSandboxAPI(testNode, t.TempDir(), &listDriver{name: "microvm", live: map[string]driver.Sandbox{}}, nil)))
	t.Cleanup(hs.Close)
	id := api.NewSandboxID(testNode)
	cmd := make([]string, 200000)
	cmd[0] = "true"
	for _, codec := range []struct {
		name string
		opts []connect.ClientOption
	}{{"proto", []connect.ClientOption{connect.WithSendGzip()}}, {"json", []connect.ClientOption{connect.WithProtoJSON(), connect.WithSendGzip()}}} {
		c := warrenv1connect.NewSandboxServiceClient(hs.Client(), hs.URL, codec.opts...)
		st, err := c.Exec(context.Background(), connect.NewRequest(&warrenv1.ExecRequest{SandboxId: id, Command: cmd}))
		if err == nil {
			for st.Receive() {
			}
			err = st.Err()
		}
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "command: over the limit of 131072 entries") {
			t.Errorf("%s: an exec of 200,000 arguments: %v, want invalid_argument naming command's limit", codec.name, err)
		}
	}
}
