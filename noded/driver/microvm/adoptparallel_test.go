package microvm

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/testenv"
)

// fakeQMP answers QMP on path: the greeting, then {"return":{}} to every
// command, and "running" to query-status, each with the command's id.
func fakeQMP(t *testing.T, path string) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintln(c, `{"QMP":{"version":{},"capabilities":[]}}`)
				r := bufio.NewScanner(c)
				for r.Scan() {
					var cmd struct {
						ID json.RawMessage `json:"id"`
					}
					_ = json.Unmarshal(r.Bytes(), &cmd)
					if strings.Contains(r.Text(), "query-status") {
						fmt.Fprintf(c, `{"return":{"status":"running"},"id":%s}`+"\n", cmd.ID)
					} else {
						fmt.Fprintf(c, `{"return":{},"id":%s}`+"\n", cmd.ID)
					}
				}
			}()
		}
	}()
}

// VMs whose guests do not answer are re-adopted side by side, not one
// after another: each waits adoptTimeout (15 s) for its agent, and a node
// with N such sandboxes (their root can stop the agent) took N × 15 s to
// start, with no heartbeats or API meanwhile. Here two VMs whose QEMU is
// a stand-in (a process named as warren names its QEMUs, a QMP socket
// that answers, an agent socket that says nothing) take one wait, not two.
func TestSilentGuestsAreReadoptedSideBySide(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for re-adoption's timeout; skipped in -short")
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		testenv.Missing(t, "needs python3 for a stand-in QEMU process")
	}
	state := t.TempDir()
	d := &Driver{cfg: Config{StateDir: state}, log: slog.New(slog.DiscardHandler), live: map[string]*VM{}, known: map[string]bool{}, scope: "t"}
	for i := range 2 {
		id := fmt.Sprintf("t-silent%d", i)
		dir := filepath.Join(state, "vms", id)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		stand := exec.Command(py, "-c", "import time; time.sleep(120)", "-name", "warren-"+id)
		if err := stand.Start(); err != nil {
			t.Fatal(err)
		}
		waited := make(chan struct{})
		go func() { stand.Wait(); close(waited) }() // reaped once killed, as QEMU is by init
		t.Cleanup(func() { stand.Process.Kill(); <-waited })
		if err := os.WriteFile(filepath.Join(dir, "pid"), []byte(strconv.Itoa(stand.Process.Pid)), 0o600); err != nil {
			t.Fatal(err)
		}
		spec := vmSpec{ID: id, Dir: dir}
		fakeQMP(t, spec.qmpPath())
		silent, err := net.Listen("unix", spec.agentPath()) // accepts, never answers
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { silent.Close() })
		m := vmMeta{ID: id, SandboxID: "sb-" + id, State: "running", Expires: time.Now().Add(time.Hour), Spec: spec}
		b, _ := json.Marshal(m)
		if err := os.WriteFile(filepath.Join(dir, "meta.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	d.adoptAll()
	took := time.Since(start)
	t.Logf("two silent guests: re-adoption took %v (each waits %v)", took.Round(time.Millisecond), adoptTimeout)
	if took > adoptTimeout*3/2 {
		t.Errorf("re-adopting two silent guests took %v, over 1.5 × the %v one waits: one after another", took, adoptTimeout)
	}
	if len(d.live) != 0 {
		t.Errorf("%d silent guests re-adopted, want none (their agents never answered)", len(d.live))
	}
}
