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
