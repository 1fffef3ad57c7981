package noded

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/noded/driver"
)

// goneDriver's Claim makes a sandbox while the caller gives up.
type goneDriver struct {
	listDriver
	t      *testing.T
	cancel context.CancelFunc
	box    chan *agentBox
}

func (d *goneDriver) Claim(ctx context.Context, req driver.ClaimRequest) (driver.Sandbox, error) {
	box := newAgentBox(d.t, req.ID)
	d.cancel()
	select { // the server sees the caller leave
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
	}
	d.mu.Lock()
	d.live[req.ID] = box
	d.mu.Unlock()
	d.box <- box
	return box, nil
}

// A sandbox made for a caller that went away during its claim is
// destroyed: nobody has its id. Before, it lived out its TTL.
func TestASandboxForACallerThatLeftIsDestroyed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	drv := &goneDriver{listDriver: listDriver{name: "microvm", live: map[string]driver.Sandbox{}}, t: t, cancel: cancel, box: make(chan *agentBox, 1)}
	c := serveSandboxAPI(t, drv)
	if _, err := c.CreateSandbox(ctx, connect.NewRequest(&warrenv1.CreateSandboxRequest{})); err == nil {
		t.Fatal("the create succeeded for a caller that had gone")
	}
	box := <-drv.box
	deadline := time.Now().Add(10 * time.Second)
	for {
		box.mu.Lock()
		gone := box.destroyed
		box.mu.Unlock()
		if gone {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox made for a caller that went away was not destroyed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
