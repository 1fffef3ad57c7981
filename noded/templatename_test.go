package noded_test

import (
	"strings"
	"testing"

	"github.com/warrenhq/warren/noded/driver"
	"github.com/warrenhq/warren/noded/driver/sim"
)

// templatesDriver is the simulated driver listing the templates it is
// given, as the microvm and container drivers list their stores'.
type templatesDriver struct {
	driver.Driver
	templates []string
}

func (d templatesDriver) Templates() []string { return d.templates }

// A node leaves out of what it advertises a template whose name the
// servers refuse (one made by hand, or by an older `warren image build`):
// it was listed, and the servers refused every hello of the node, which
// never joined.
func TestANodeLeavesOutTemplatesTheServersRefuse(t *testing.T) {
	c := startCluster(t, 1, 0)
	c.startNodeWith("a", templatesDriver{sim.New(sim.Config{}), []string{"default", "MyTpl", "py3.11"}})
	n, err := c.node("a")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(n.GetTemplates(), ","); got != "default,py3.11" {
		t.Errorf("node a advertises %q, want default,py3.11", got)
	}
}
