package microvm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/guest"
)

// fakeQEMU answers a pause's QMP commands on s's socket as QEMU would:
// the migration writes saved into the descriptor getfd passed, and quit
// closes exited. seen lists the commands so far, quit with meta.json's
// state when it came ("quit (meta.json: paused)").
func fakeQEMU(t *testing.T, s vmSpec, saved []byte, exited chan struct{}) (seen func() []string) {
	t.Helper()
	var mu sync.Mutex
	var cmds []string
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: s.qmpPath(), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		var id json.RawMessage // the command's, which its reply carries
		reply := func(v any) { b, _ := json.Marshal(map[string]any{"return": v, "id": id}); c.Write(append(b, '\n')) }
		c.Write([]byte(`{"QMP": {}}` + "\n"))
		var fd *os.File
		buf, oob := make([]byte, 64<<10), make([]byte, 1024)
		for {
			n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil && len(msgs) > 0 {
				if fds, err := syscall.ParseUnixRights(&msgs[0]); err == nil && len(fds) > 0 {
					fd = os.NewFile(uintptr(fds[0]), "state")
				}
			}
			sc := bufio.NewScanner(bytes.NewReader(buf[:n]))
			for sc.Scan() {
				var cmd struct {
					Execute string
					ID      json.RawMessage `json:"id"`
				}
				if json.Unmarshal(sc.Bytes(), &cmd) != nil {
					return
				}
				id = cmd.ID
				mu.Lock()
				cmds = append(cmds, cmd.Execute)
				mu.Unlock()
				switch cmd.Execute {
				case "migrate":
					if fd == nil {
						t.Error("migrate without a descriptor")
						return
					}
					fd.Write(saved)
					fd.Close()
					reply(map[string]any{})
				case "query-migrate":
					reply(map[string]any{"status": "completed"})
				case "quit":
					mu.Lock()
					cmds[len(cmds)-1] = "quit (meta.json: " + metaStateIn(s.Dir) + ")"
					mu.Unlock()
					close(exited)
					reply(map[string]any{})
					return
				default: // qmp_capabilities, stop, migrate-set-capabilities, getfd
					reply(map[string]any{})
				}
			}
		}
	}()
	return func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(cmds) }
}

// A pause syncs paused.state and the VM's directory before meta.json
// says "paused" (and so before Pause returns): a power loss after a
// pause that returned must not leave a state file cut short, or a
// directory without it. QEMU and the guest are fakes: the QMP commands
// are answered as QEMU answers them, and the agent is a guest.Server on
// a pipe.
func TestPauseSyncsStateBeforeRecordingIt(t *testing.T) {
	vm, _, saved, ctx := fakePausable(t)
	dir := vm.spec.Dir
	metaState := func() string { return metaStateIn(dir) }
	var mu sync.Mutex
	var syncs []string
	was := durable
	durable = func(path string) error {
		mu.Lock()
		syncs = append(syncs, path+" (meta.json: "+metaState()+")")
		mu.Unlock()
		return was(path)
	}
	defer func() { durable = was }()

	if err := vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "paused.state")
	want := []string{state + " (meta.json: running)", dir + " (meta.json: running)"}
	if strings.Join(syncs, "\n") != strings.Join(want, "\n") {
		t.Errorf("syncs of the pause:\n%s\nwant:\n%s", strings.Join(syncs, "\n"), strings.Join(want, "\n"))
	}
	if got := metaState(); got != "paused" {
		t.Errorf("meta.json after the pause: %q, want paused", got)
	}
	if b, err := os.ReadFile(state); err != nil || !bytes.Equal(b, saved) {
		t.Errorf("paused.state: %d bytes (%v), want the %d QEMU wrote", len(b), err, len(saved))
	}
	var m vmMeta
	if b, err := os.ReadFile(filepath.Join(dir, "meta.json")); err != nil || json.Unmarshal(b, &m) != nil || m.PausedSize != int64(len(saved)) {
		t.Errorf("meta.json records paused.state's size as %d (%v), want %d", m.PausedSize, err, len(saved))
	}
}

// A pause records "paused" (with the state's size) before it ends QEMU,
// so a node that dies in between finds the sandbox paused, not a record
// saying running without a QEMU, which the next start destroyed.
func TestPauseIsRecordedBeforeQEMUEnds(t *testing.T) {
	vm, seen, _, ctx := fakePausable(t)
	if err := vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if cmds := seen(); !slices.Contains(cmds, "quit (meta.json: paused)") {
		t.Errorf("QMP commands %q: want quit with meta.json saying paused", cmds)
	}
}

// A pause whose state cannot be synced fails and is undone, as a failed
// save is: the file removed, the guest running again, meta.json still
// "running".
func TestPauseWhoseSyncFailsIsUndone(t *testing.T) {
	vm, seen, _, ctx := fakePausable(t)
	was := durable
	durable = func(string) error { return syscall.EIO }
	defer func() { durable = was }()
	if err := vm.Pause(ctx); err == nil || !strings.Contains(err.Error(), "sync") {
		t.Fatalf("pause whose sync failed: %v, want a sync error", err)
	}
	if _, err := os.Stat(filepath.Join(vm.spec.Dir, "paused.state")); !os.IsNotExist(err) {
		t.Errorf("paused.state left behind: %v", err)
	}
	if cmds := seen(); len(cmds) == 0 || cmds[len(cmds)-1] != "cont" {
		t.Errorf("QMP commands %q: the guest was not let run again", cmds)
	}
	if vm.state != "running" || metaStateIn(vm.spec.Dir) != "running" {
		t.Errorf("state %q, meta.json %q after a failed pause, want running", vm.state, metaStateIn(vm.spec.Dir))
	}
}

func metaStateIn(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return "(none)"
	}
	var m vmMeta
	_ = json.Unmarshal(b, &m)
	return m.State
}

// fakePausable is a running sandbox on a fake QEMU (fakeQEMU) and a fake
// guest (a guest.Server on a pipe), its meta.json written.
func fakePausable(t *testing.T) (vm *VM, seen func() []string, saved []byte, ctx context.Context) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "vms", "vm-1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	spec := vmSpec{ID: "vm-1", Dir: dir}
	saved = bytes.Repeat([]byte("saved state "), 1000)
	exited := make(chan struct{})
	seen = fakeQEMU(t, spec, saved, exited)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	q, err := DialQMP(ctx, spec.qmpPath())
	if err != nil {
		t.Fatal(err)
	}
	host, gst := net.Pipe()
	go func() { _ = (&guest.Server{}).Serve(gst) }()
	agent, err := guest.NewClient(host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agent.Close(); q.Close() })
	d := &Driver{log: slog.New(slog.DiscardHandler)}
	// pid: none that exists; kill is not reached, as quit closes exited.
	vm = &VM{d: d, id: "vm-1", sandboxID: "sb-1", state: "running", spec: spec, qmp: q, agent: agent,
		p: &proc{pid: 1 << 30, exited: exited}, expires: time.Now().Add(time.Hour)}
	vm.save()
	return vm, seen, saved, ctx
}
