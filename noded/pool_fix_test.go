package noded

import (
	"runtime"
	"sync"
	"testing"

	"github.com/warrenhq/warren/noded/driver"
)

// holdingPoolDriver is a driver.Pooler whose first SetPoolTarget call for
// the template hold waits for release (the microvm driver's call may be
// slow), and which records the targets it ends with.
type holdingPoolDriver struct {
	listDriver
	hold     string
	held     chan struct{} // closed when the held call has begun
	release  chan struct{}
	holdOnce sync.Once
	mu       sync.Mutex
	targets  map[string]int
}

func newHoldingPoolDriver(hold string) *holdingPoolDriver {
	return &holdingPoolDriver{listDriver: listDriver{name: "microvm"}, hold: hold,
		held: make(chan struct{}), release: make(chan struct{}), targets: map[string]int{}}
}

func (d *holdingPoolDriver) SetPoolTarget(t string, n int) {
	if t == d.hold {
		first := false
		d.holdOnce.Do(func() { first = true })
		if first {
			close(d.held)
			<-d.release
		}
	}
	d.mu.Lock()
	d.targets[t] = n
	d.mu.Unlock()
}

func (d *holdingPoolDriver) Pools() []driver.PoolStatus { return nil }

func (d *holdingPoolDriver) target(t string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.targets[t]
}

// Targets of two templates set at once are both saved: pools.json was
// marshalled under the lock and written after it, so the call that
// marshalled first could write last and drop the other's target. A slow
// driver call for one template does not hold up the other's.
func TestConcurrentPoolTargetsAreBothSaved(t *testing.T) {
	dir := t.TempDir()
	drv := newHoldingPoolDriver("a")
	a := NewSandboxAPI(testNode, dir, drv, nil)
	done := make(chan error, 1)
	go func() { done <- a.setTarget("a", 5, direct) }()
	<-drv.held
	if err := a.setTarget("b", 3, direct); err != nil { // while a's call is held
		t.Fatal(err)
	}
	if got := drv.target("b"); got != 3 {
		t.Fatalf("driver's target for b %d, want 3 while a's call is held", got)
	}
	close(drv.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	re := newHoldingPoolDriver("")
	NewSandboxAPI(testNode, dir, re, nil)
	if re.target("a") != 5 || re.target("b") != 3 {
		t.Fatalf("targets after a restart %v, want a=5 b=3", re.targets)
	}
}

// Two targets for one template set at once: the driver and pools.json both
// end with the one set last.
func TestConcurrentPoolTargetsForOneTemplateEndWithTheLast(t *testing.T) {
	dir := t.TempDir()
	drv := newHoldingPoolDriver("a")
	a := NewSandboxAPI(testNode, dir, drv, nil)
	done := make(chan error, 2)
	go func() { done <- a.setTarget("a", 5, direct) }()
	<-drv.held // the first call is applying its target
	go func() { done <- a.setTarget("a", 2, direct) }()
	// The second call has saved its target before it waits for the first
	// call's to be applied; wait for that.
	for {
		a.mu.Lock()
		n := a.pools["a"]
		a.mu.Unlock()
		if n == 2 {
			break
		}
		runtime.Gosched()
	}
	close(drv.release)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if got := drv.target("a"); got != 2 {
		t.Fatalf("driver's target %d, want 2 (set last)", got)
	}
	re := newHoldingPoolDriver("")
	NewSandboxAPI(testNode, dir, re, nil)
	if got := re.target("a"); got != 2 {
		t.Fatalf("target after a restart %d, want 2", got)
	}
}
