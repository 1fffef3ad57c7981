package noded

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded/driver"
)

// gatedPoolDriver: the first SetPoolTarget call blocks on gate (a slow
// driver call: a template loading); hasGate, if set, blocks HasTemplate.
type gatedPoolDriver struct {
	listDriver
	tmu     sync.Mutex
	targets map[string]int
	first   chan string
	gate    chan struct{}
	calls   int
	hasGate chan struct{}
	hasIn   chan struct{}
	hasErr  error
}

func (d *gatedPoolDriver) SetPoolTarget(t string, n int) {
	d.tmu.Lock()
	d.calls++
	c := d.calls
	d.targets[t] = n
	d.tmu.Unlock()
	if c == 1 && d.first != nil {
		d.first <- t
		<-d.gate
	}
}
func (d *gatedPoolDriver) Pools() []driver.PoolStatus { return nil }
func (d *gatedPoolDriver) HasTemplate(string) error {
	if d.hasGate != nil {
		d.hasIn <- struct{}{}
		<-d.hasGate
	}
	return d.hasErr
}
func (d *gatedPoolDriver) get(t string) int {
	d.tmu.Lock()
	defer d.tmu.Unlock()
	return d.targets[t]
}

// A session's complete set is applied one template at a time: a direct
// set of a later template made while an earlier one's driver call is slow
// is newer than the set and stays. (It was undone when the set was
// checked against the direct sets for all templates before the first
// driver call.)
func TestSessionSetDoesNotUndoADirectSetMadeWhileItApplies(t *testing.T) {
	drv := &gatedPoolDriver{listDriver: listDriver{name: "microvm"}, targets: map[string]int{},
		first: make(chan string, 1), gate: make(chan struct{})}
	a := NewSandboxAPI(testNode, t.TempDir(), drv, nil)
	d := &Daemon{cfg: Config{ID: testNode, Driver: drv}, log: slog.New(slog.DiscardHandler), Sandboxes: a}
	set := []*warrenv1.SetPoolTarget{{Template: "a", Target: 1}, {Template: "b", Target: 1}}
	mark := d.sessionMark()
	d.applyPoolsLater(func() { d.setPoolTargets(set, mark) })
	firstT := <-drv.first // setTargets has checked both and is in the slow driver call for one
	other := "a"
	if firstT == "a" {
		other = "b"
	}
	if _, err := a.SetPoolTarget(context.Background(), connect.NewRequest(&warrenv1.SetPoolTargetRequest{Template: other, Target: 5})); err != nil {
		t.Fatal(err)
	}
	close(drv.gate)
	d.wg.Wait()
	if got := drv.get(other); got != 5 {
		t.Errorf("template %s: driver target %d after the direct set of 5 (the older session's 1 overwrote it)", other, got)
	}
}

// A direct set that is refused changes nothing: a queued (older) session
// target applied while the direct set was being checked still applies.
// (The direct set used to be marked before its checks, so the session's
// target was skipped, and lost until the next session.)
func TestARefusedDirectSetDoesNotDropASessionTarget(t *testing.T) {
	drv := &gatedPoolDriver{listDriver: listDriver{name: "microvm"}, targets: map[string]int{},
		hasGate: make(chan struct{}), hasIn: make(chan struct{}, 1), hasErr: driver.Errorf(driver.ErrNotFound, "no such template yet")}
	a := NewSandboxAPI(testNode, t.TempDir(), drv, nil)
	d := &Daemon{cfg: Config{ID: testNode, Driver: drv}, log: slog.New(slog.DiscardHandler), Sandboxes: a}
	gate := make(chan struct{})
	d.applyPoolsLater(func() { <-gate }) // a slow call ahead
	mark := d.sessionMark()
	d.applyPoolsLater(func() { d.setPoolTarget("default", 3, mark) })
	errc := make(chan error, 1)
	go func() {
		_, err := a.SetPoolTarget(context.Background(), connect.NewRequest(&warrenv1.SetPoolTargetRequest{Template: "default", Target: 7}))
		errc <- err
	}()
	<-drv.hasIn // the direct set is marked, in HasTemplate
	close(gate) // the queued, older session target runs now
	for deadline := time.Now().Add(5 * time.Second); drv.get("default") != 3; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			close(drv.hasGate)
			t.Fatalf("the session's target 3 was not applied while a direct set was being checked (driver target %d)", drv.get("default"))
		}
	}
	close(drv.hasGate) // HasTemplate refuses
	if err := <-errc; err == nil {
		t.Fatal("direct set not refused")
	}
	d.wg.Wait()
	if got := drv.get("default"); got != 3 {
		t.Errorf("driver target %d for default: the session's 3 was skipped for a direct set that was then refused", got)
	}
}
