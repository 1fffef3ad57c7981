package microvm

import (
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/guest"
)

// stuckNetwork is a VM's network whose Close blocks until release is
// closed: a destroy held in its teardown.
type stuckNetwork struct {
	closing chan struct{} // closed when Close is entered
	release chan struct{}
	closed  atomic.Bool
}

func (n *stuckNetwork) NSPath() string                       { return "" }
func (n *stuckNetwork) OpenTap() (*os.File, error)           { return nil, os.ErrInvalid }
func (n *stuckNetwork) GuestConfig(tap bool) guest.NetConfig { return guest.NetConfig{} }
func (n *stuckNetwork) Close() error {
	close(n.closing)
	<-n.release
	n.closed.Store(true)
	return nil
}

// A destroy that finds another under way (the TTL's, or watchExit's after
// QEMU died) returns only once that one has finished: a caller that
// deletes a sandbox and then looks for leftovers, or reuses its id, finds
// none. It returned at once, while the first still removed the tap and
// the VM's directory.
func TestSecondDestroyWaitsForTheFirst(t *testing.T) {
	d := &Driver{log: slog.New(slog.DiscardHandler), live: map[string]*VM{}, known: map[string]bool{}}
	dir := filepath.Join(t.TempDir(), "vm-x")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	nw := &stuckNetwork{closing: make(chan struct{}), release: make(chan struct{})}
	vm := &VM{d: d, id: "vm-x", sandboxID: "sb-x", state: "running", spec: vmSpec{ID: "vm-x", Dir: dir}, net: nw}
	d.live["sb-x"], d.known["vm-x"] = vm, true
	release := sync.OnceFunc(func() { close(nw.release) })
	t.Cleanup(release) // a failed test lets the first destroy end too

	first := make(chan struct{})
	go func() { defer close(first); vm.destroy() }() // as the TTL or watchExit does
	<-nw.closing
	second := make(chan struct{})
	go func() { defer close(second); _ = vm.Destroy() }()
	select {
	case <-second:
		_, statErr := os.Stat(dir)
		d.mu.Lock()
		_, listed := d.live["sb-x"]
		d.mu.Unlock()
		t.Fatalf("the second Destroy returned while the first was under way (network removed: %v, directory left: %v, still listed: %v)",
			nw.closed.Load(), statErr == nil, listed)
	case <-time.After(time.Second):
	}
	release()
	<-second
	if !nw.closed.Load() {
		t.Error("after the second Destroy: the network is not removed")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("after the second Destroy: the VM's directory: %v", err)
	}
	d.mu.Lock()
	_, listed := d.live["sb-x"]
	known := d.known["vm-x"]
	d.mu.Unlock()
	if listed || known {
		t.Errorf("after the second Destroy: listed %v, owned %v", listed, known)
	}
	<-first
}
