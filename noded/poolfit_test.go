package noded

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/noded/driver"
)

// sizedPoolDriver is a poolDriver that says how much memory one warm
// sandbox of each template holds (a driver.PoolSizer).
type sizedPoolDriver struct {
	poolDriver
	each map[string]int64
}

func (d *sizedPoolDriver) PoolMemberBytes(t string) int64 { return d.each[t] }

// Pools reports the targets the driver was given, as a real one does.
func (d *sizedPoolDriver) Pools() []driver.PoolStatus {
	var out []driver.PoolStatus
	for t, n := range d.targets {
		out = append(out, driver.PoolStatus{Template: t, Target: n})
	}
	return out
}

func newSizedPoolDriver(t *testing.T) *sizedPoolDriver {
	mem := memTotal()
	if mem <= 0 {
		t.Skip("needs /proc/meminfo's MemTotal")
	}
	// "big": three fit in this host's memory, four do not; "huge": not
	// one; "small": a thousand take an eighth of it, so that they fit
	// beside three of big (the pools are counted together).
	return &sizedPoolDriver{poolDriver: poolDriver{listDriver: listDriver{name: "microvm"}, targets: map[string]int{}},
		each: map[string]int64{"big": mem/4 + 1, "huge": mem + 1, "small": mem / 8000}}
}

// memTotal is the host's memory (MemTotal), which a node's targets are
// checked against when it declares no smaller capacity.
func memTotal() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// poolSetter serves a over HTTP for the test and returns a call of its
// SetPoolTarget, as `warren pool set` makes it.
func poolSetter(t *testing.T, a *SandboxAPI) func(tpl string, n uint32) error {
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(a))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	c := warrenv1connect.NewSandboxServiceClient(hs.Client(), hs.URL)
	return func(tpl string, n uint32) error {
		_, err := c.SetPoolTarget(context.Background(), connect.NewRequest(&warrenv1.SetPoolTargetRequest{Template: tpl, Target: n}))
		return err
	}
}

// `warren pool set T N` with more warm sandboxes than the node's memory
// holds is refused as invalid_argument naming the target and the figures,
// and the template keeps the target it had; the driver is not asked to
// start them. It was accepted, and the node tried to start them all.
func TestPoolTargetOverTheNodesMemoryIsRefused(t *testing.T) {
	drv := newSizedPoolDriver(t)
	dir := t.TempDir()
	a := NewSandboxAPI(testNode, dir, drv, nil)
	set := poolSetter(t, a)
	if err := set("big", 3); err != nil {
		t.Fatalf("a target that fits: %v", err)
	}
	if err := set("small", 1000); err != nil {
		t.Fatalf("a target that fits: %v", err)
	}
	err := set("big", 4)
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("a target over the node's memory: %v; want invalid_argument", err)
	}
	for _, want := range []string{"target 4:", "needs ", "4 warm sandboxes of big ", "with the node's other pools (small: 1000 × ", "node " + testNode + " has ", "room for 3 of big"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
	if err := set("huge", 1); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("one warm sandbox larger than the node: %v; want invalid_argument", err)
	}
	if drv.targets["big"] != 3 || drv.targets["small"] != 1000 {
		t.Errorf("driver's targets %v: want big=3 (kept) and small=1000", drv.targets)
	}
	if _, ok := drv.targets["huge"]; ok {
		t.Errorf("the driver was given the refused target huge=%d", drv.targets["huge"])
	}
	b, _ := os.ReadFile(filepath.Join(dir, "pools.json"))
	if strings.Contains(string(b), "huge") || !strings.Contains(string(b), `"big":3`) {
		t.Errorf("pools.json %s: want big at 3 and no huge", b)
	}
}

// The leader's session sends the cluster's targets at each open: one this
// node refuses is not applied, and its refusal is logged once, not at
// every session (nor does it stop the others). Both with a sandbox API and
// without one (the driver's targets set directly).
func TestRefusedSessionTargetsAreLoggedOnce(t *testing.T) {
	set := []*warrenv1.SetPoolTarget{{Template: "huge", Target: 2}, {Template: "small", Target: 2}}
	for _, withAPI := range []bool{true, false} {
		drv := newSizedPoolDriver(t)
		var logw syncBuffer
		log := slog.New(slog.NewTextHandler(&logw, nil))
		d := &Daemon{cfg: Config{ID: testNode, Driver: drv}, log: log}
		if withAPI {
			d.Sandboxes = NewSandboxAPI(testNode, t.TempDir(), drv, log)
		}
		for i := 0; i < 3; i++ {
			d.setPoolTargets(set, 0)
		}
		if n, ok := drv.targets["huge"]; ok {
			t.Errorf("sandbox API %v: the driver was given the refused target huge=%d", withAPI, n)
		}
		if drv.targets["small"] != 2 {
			t.Errorf("sandbox API %v: small's target %d, want 2", withAPI, drv.targets["small"])
		}
		if n := strings.Count(logw.String(), "pool target refused"); n != 1 {
			t.Errorf("sandbox API %v: the refusal was logged %d times over 3 sessions, want once:\n%s", withAPI, n, logw.String())
		}
	}
}

// A target saved in pools.json is checked at start against the node's
// memory as the node declares it (--capacity mem=, when less than the
// host's), not the host's alone: one over it is dropped, not applied, and
// the session's complete set naming it again is refused too.
func TestRestoredPoolTargetIsCheckedAgainstTheDeclaredCapacity(t *testing.T) {
	drv := newSizedPoolDriver(t) // "big": 3 fit in the host's memory
	each := drv.each["big"]
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pools.json"), []byte(`{"big":3}`), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &Daemon{cfg: Config{ID: testNode, DataDir: dir, Driver: drv, SandboxListen: "127.0.0.1:0",
		Capacity: &warrenv1.Resources{MemoryBytes: 2 * each}}, // room for 2
		log: slog.New(slog.DiscardHandler)}
	if err := d.serveSandboxes(); err != nil {
		t.Fatal(err)
	}
	defer d.sandboxSrv.Close()
	if n, ok := drv.targets["big"]; ok {
		t.Errorf("the node declares room for 2 warm sandboxes of big, and pools.json's target 3 was applied at start (driver target %d)", n)
	}
	// The leader's complete set, naming the same target, does not refuse it either.
	d.setPoolTargets([]*warrenv1.SetPoolTarget{{Template: "big", Target: 3}}, 0)
	if n := drv.targets["big"]; n == 3 {
		t.Errorf("after the session's set: driver target %d for big, over the declared capacity (room for 2)", n)
	}
}

// The node's pools are checked together: a target is refused when its
// warm sandboxes do not fit beside the other templates' current targets,
// naming them and the sums, directly and from the leader's session, with
// a sandbox API and without. Before, each template was checked alone, and
// on a 16 GiB node `pool set default 40` and `pool set py 40` (10 GiB
// each) were both accepted. A session's set that moves memory from one
// template to another applies the lowered target first, so it fits.
func TestPoolTargetsAreCheckedTogether(t *testing.T) {
	mem := memTotal()
	if mem <= 0 {
		t.Skip("needs /proc/meminfo's MemTotal")
	}
	newDrv := func() *sizedPoolDriver {
		// Three of either fit, not six of both.
		return &sizedPoolDriver{poolDriver: poolDriver{listDriver: listDriver{name: "microvm"}, targets: map[string]int{}},
			each: map[string]int64{"big": mem/4 + 1, "big2": mem/4 + 1}}
	}
	refusal := func(t *testing.T, what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("%s: %v; want invalid_argument", what, err)
		}
		for _, want := range []string{"target 3:", "3 warm sandboxes of big2 ", "with the node's other pools (big: 3 × ", "room for 0 of big2"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: the refusal %q does not say %q", what, err, want)
			}
		}
	}

	t.Run("sandbox API", func(t *testing.T) {
		drv := newDrv()
		a := NewSandboxAPI(testNode, t.TempDir(), drv, nil)
		set := poolSetter(t, a)
		if err := set("big", 3); err != nil {
			t.Fatalf("big 3 alone: %v", err)
		}
		refusal(t, "big2 3 beside big 3", set("big2", 3))
		if _, ok := drv.targets["big2"]; ok || drv.targets["big"] != 3 {
			t.Errorf("driver's targets %v: want big=3 and none for big2", drv.targets)
		}
		// Big's own target is replaced, not added to.
		if err := set("big", 2); err != nil {
			t.Fatalf("big 2 in place of 3: %v", err)
		}
		if err := set("big2", 1); err != nil {
			t.Fatalf("big2 1 beside big 2: %v", err)
		}
		// The session's set (come after the direct sets) moves memory
		// from big to big2.
		a.mu.Lock()
		mark := a.direct
		a.mu.Unlock()
		a.setTargets([]*warrenv1.SetPoolTarget{{Template: "big2", Target: 2}, {Template: "big", Target: 1}}, mark)
		if drv.targets["big"] != 1 || drv.targets["big2"] != 2 {
			t.Errorf("after the session's set big=1, big2=2: driver's targets %v", drv.targets)
		}
	})

	t.Run("session without a sandbox API", func(t *testing.T) {
		drv := newDrv()
		var logw syncBuffer
		d := &Daemon{cfg: Config{ID: testNode, Driver: drv}, log: slog.New(slog.NewTextHandler(&logw, nil))}
		d.setPoolTargets([]*warrenv1.SetPoolTarget{{Template: "big", Target: 3}, {Template: "big2", Target: 3}}, 0)
		if _, ok := drv.targets["big2"]; ok || drv.targets["big"] != 3 {
			t.Errorf("driver's targets %v: want big=3 and none for big2", drv.targets)
		}
		if !strings.Contains(logw.String(), "pool target refused") {
			t.Errorf("no refusal logged:\n%s", logw.String())
		}
		for _, want := range []string{"template=big2", "3 warm sandboxes of big2 ", "with the node's other pools (big: 3 × "} {
			if !strings.Contains(logw.String(), want) {
				t.Errorf("the logged refusal does not say %q:\n%s", want, logw.String())
			}
		}
		d.setPoolTargets([]*warrenv1.SetPoolTarget{{Template: "big2", Target: 2}, {Template: "big", Target: 1}}, 0)
		if drv.targets["big"] != 1 || drv.targets["big2"] != 2 {
			t.Errorf("after the session's set big=1, big2=2: driver's targets %v", drv.targets)
		}
	})

	t.Run("pools.json", func(t *testing.T) {
		drv := newDrv()
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "pools.json"), []byte(`{"big":3,"big2":3}`), 0o644); err != nil {
			t.Fatal(err)
		}
		NewSandboxAPI(testNode, dir, drv, nil)
		if _, ok := drv.targets["big2"]; ok || drv.targets["big"] != 3 {
			t.Errorf("driver's targets from pools.json %v: want big=3 (first by name) and none for big2", drv.targets)
		}
	})
}

// A lowered target always passes, even where the recorded targets do not
// fit together: a template whose target came before the node had it (its
// size unknown, so not counted) counts once it is built, though its pool
// was never filled. Before, every lowering but to 0 was refused then.
func TestALoweredPoolTargetIsNeverRefused(t *testing.T) {
	mem := memTotal()
	if mem <= 0 {
		t.Skip("needs /proc/meminfo's MemTotal")
	}
	drv := &sizedPoolDriver{poolDriver: poolDriver{listDriver: listDriver{name: "microvm"}, targets: map[string]int{}},
		each: map[string]int64{"big": mem/4 + 1}} // "late" is not built yet: size 0
	a := NewSandboxAPI(testNode, t.TempDir(), drv, nil)
	a.mu.Lock()
	mark := a.direct
	a.mu.Unlock()
	a.setTargets([]*warrenv1.SetPoolTarget{{Template: "big", Target: 3}, {Template: "late", Target: 3}}, mark)
	if drv.targets["big"] != 3 {
		t.Fatalf("big 3 alone: driver's targets %v", drv.targets)
	}
	drv.each["late"] = mem/4 + 1 // built since
	_, err := a.SetPoolTarget(context.Background(), connect.NewRequest(&warrenv1.SetPoolTargetRequest{Template: "big", Target: 2}))
	if err != nil || drv.targets["big"] != 2 {
		t.Fatalf("big lowered from 3 to 2: %v; driver's targets %v", err, drv.targets)
	}
}
