package microvm

import (
	"testing"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/internal/testenv"
)

// A warm sandbox of a template the driver has holds the snapshot's guest
// memory (the node refuses pool targets the host cannot hold with it); one
// it does not have is 0, unknown.
func TestPoolMemberBytesIsTheGuestMemory(t *testing.T) {
	if _, err := guest.LoadTemplate(imageDir(), "default"); err != nil {
		testenv.Missing(t, "needs the default template: %v (run `make image`)", err)
	}
	d := &Driver{cfg: Config{ImageDir: imageDir(), DefaultTemplate: "default", SnapshotMemMB: 384}, templates: map[string]*tplState{}}
	if got := d.PoolMemberBytes("default"); got != 384<<20 {
		t.Errorf("default: %d bytes, want %d", got, 384<<20)
	}
	if got := d.PoolMemberBytes("no-such-template"); got != 0 {
		t.Errorf("an unknown template: %d bytes, want 0", got)
	}
}

// A negative pool target (a node's pools.json could hold one) is 0: the
// pool's trim indexed ts.pool[-1] and panicked.
func TestNegativePoolTargetIsZero(t *testing.T) {
	d := newDriverWith(t, "", func(c *Config) { c.StandbyQEMUs = -1 })
	if r := panicOf(func() { d.SetPoolTarget("", -1) }); r != nil {
		// Not closed: the call panicked holding d.mu, which Close takes.
		t.Fatalf("SetPoolTarget(-1) panicked: %v", r)
	}
	defer d.Close()
	for _, p := range d.Pools() {
		if p.Target != 0 {
			t.Errorf("template %s: target %d, want 0", p.Template, p.Target)
		}
	}
}

// panicOf calls f and returns what it panicked with (nil if it did not).
func panicOf(f func()) (r any) {
	defer func() { r = recover() }()
	f()
	return nil
}
