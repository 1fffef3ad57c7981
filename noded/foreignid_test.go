package noded_test

import (
	"context"
	"sync"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/noded/driver"
	"github.com/warrenhq/warren/noded/driver/sim"
)

// A node started under a new --id on a data directory whose driver
// re-adopts sandboxes made under the old one destroys those: the servers
// route every call about them to the old id's node, and this one refused
// them, so they were listed here but could be neither used nor deleted
// until their TTL. Its own and task sandboxes stay.
func TestSandboxesOfAnotherNodeIDAreDestroyedAtStart(t *testing.T) {
	sd := sim.New(sim.Config{})
	var mu sync.Mutex
	var ids []string
	drv := listingSim{sd, &mu, &ids}
	foreign, own, task := api.NewSandboxID("old-name"), api.NewSandboxID("n1"), "t-0000000001-e1"
	for _, id := range []string{foreign, own, task} {
		if _, err := drv.Claim(context.Background(), driver.ClaimRequest{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	f := &fakeLeader{ttl: 0}
	f.leaderURL.Store("http://" + f.serve(t))
	startNodeWithDriver(t, f.leaderURL.Load().(string), drv)
	if _, ok := sd.Get(foreign); ok {
		t.Errorf("sandbox %s, made under node old-name, still runs on n1", foreign)
	}
	for _, id := range []string{own, task} {
		if _, ok := sd.Get(id); !ok {
			t.Errorf("sandbox %s was destroyed", id)
		}
	}
}
