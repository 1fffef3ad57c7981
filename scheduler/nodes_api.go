package scheduler

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

var reNodeID = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// defaultDrainDeadline is how long a drain gives tasks to move off.
const defaultDrainDeadline = time.Hour

func (p *problems) nodeID(field, id string) {
	if !reNodeID.MatchString(id) {
		p.add(field, "%q must be 1-63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit", truncate(id, 80))
	}
}

// ValidateNode checks a node's registration as the servers do when it
// says hello, so that `warren node` can refuse its flags at start instead
// of being refused by the servers for good, its errors naming node.id,
// node.labels, node.templates and so on.
func ValidateNode(n *warrenv1.Node) error { return validateNode(n) }

func validateNode(n *warrenv1.Node) error {
	var p problems
	if n == nil {
		p.add("node", "required")
		return p.err()
	}
	p.nodeID("node.id", n.GetId())
	if len(n.GetDrivers()) == 0 {
		p.add("node.drivers", "required: at least one of %v", Drivers)
	}
	for i, d := range n.GetDrivers() {
		if !slices.Contains(Drivers, d) {
			p.add(fmt.Sprintf("node.drivers[%d]", i), "%q is not one of %v", truncate(d, 40), Drivers)
		}
	}
	for i, t := range n.GetTemplates() {
		if !reTemplate.MatchString(t) {
			p.add(fmt.Sprintf("node.templates[%d]", i), "%q must be 1-128 of a-z, 0-9, '.', '_', '-'", truncate(t, 80))
		}
	}
	if c := n.GetCapacity(); c.GetMilliCpu() <= 0 || c.GetMemoryBytes() <= 0 {
		p.add("node.capacity", "cpu and memory must both be positive, got %dm and %d B", c.GetMilliCpu(), c.GetMemoryBytes())
	}
	if n := len(n.GetLabels()); n > maxLabels {
		p.add("node.labels", "%d labels is over the limit of %d", n, maxLabels)
	}
	for k, v := range n.GetLabels() {
		if !reLabelKey.MatchString(k) {
			p.add("node.labels", "key %q must be 1-63 of a-z, 0-9, '.', '/', '_', '-'", truncate(k, 80))
		}
		p.text("node.labels["+truncate(k, 63)+"]", v, false, maxLabelValue, true)
	}
	if a := n.GetAccelerator(); a != "" && a != "kvm" && a != "tcg" {
		p.add("node.accelerator", "%q is not kvm, tcg or empty", truncate(a, 40))
	}
	p.text("node.address", n.GetAddress(), false, 256, true)
	if u := n.GetSandboxUrl(); u != "" && !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		p.add("node.sandbox_url", "%q must be an http:// or https:// URL", truncate(u, 80))
	}
	p.text("node.sandbox_url", n.GetSandboxUrl(), false, 256, true)
	return p.err()
}

func (c clusterAPI) RegisterNode(ctx context.Context, req *connect.Request[warrenv1.RegisterNodeRequest]) (*connect.Response[warrenv1.RegisterNodeResponse], error) {
	if err := validateNode(req.Msg.GetNode()); err != nil {
		return nil, invalid(err)
	}
	res, err := taskAPI(c).write(ctx, &fsmv1.RegisterNode{Node: req.Msg.GetNode(), Time: timestamppb.New(c.s.clock.Now())})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&warrenv1.RegisterNodeResponse{Node: res.GetNode()}), nil
}

func (c clusterAPI) ListNodes(ctx context.Context, _ *connect.Request[warrenv1.ListNodesRequest]) (*connect.Response[warrenv1.ListNodesResponse], error) {
	nodes, err := c.s.readNodes()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&warrenv1.ListNodesResponse{Nodes: nodes}), nil
}

// maxDrainDeadline bounds a drain's deadline_seconds (a year): a larger
// one would overflow a time.Duration, and 584 years wrapped to 0.29 s, a
// drain that forces the node's tasks off at once.
const maxDrainDeadline = 365 * 24 * time.Hour

func (c clusterAPI) nodeOp(ctx context.Context, id string, op fsmv1.NodeOp_Op, deadlineSeconds int64) (*connect.Response[warrenv1.NodeResponse], error) {
	var p problems
	p.nodeID("id", id)
	if deadlineSeconds < 0 || deadlineSeconds > int64(maxDrainDeadline/time.Second) {
		p.add("deadline_seconds", "must be 0 (an hour) to %d (a year), got %d", int64(maxDrainDeadline/time.Second), deadlineSeconds)
	}
	deadline := time.Duration(max(deadlineSeconds, 0)) * time.Second
	if err := p.err(); err != nil {
		return nil, invalid(err)
	}
	now := c.s.clock.Now()
	m := &fsmv1.NodeOp{Id: id, Op: op, Reason: "operator", Time: timestamppb.New(now)}
	if op == fsmv1.NodeOp_OP_DRAIN {
		if deadline == 0 {
			deadline = defaultDrainDeadline
		}
		m.DrainDeadline = timestamppb.New(now.Add(deadline))
	}
	res, err := taskAPI(c).write(ctx, m)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&warrenv1.NodeResponse{Node: res.GetNode()}), nil
}

func (c clusterAPI) CordonNode(ctx context.Context, req *connect.Request[warrenv1.NodeRequest]) (*connect.Response[warrenv1.NodeResponse], error) {
	return c.nodeOp(ctx, req.Msg.GetId(), fsmv1.NodeOp_OP_CORDON, 0)
}

func (c clusterAPI) UncordonNode(ctx context.Context, req *connect.Request[warrenv1.NodeRequest]) (*connect.Response[warrenv1.NodeResponse], error) {
	return c.nodeOp(ctx, req.Msg.GetId(), fsmv1.NodeOp_OP_UNCORDON, 0)
}

func (c clusterAPI) DrainNode(ctx context.Context, req *connect.Request[warrenv1.DrainNodeRequest]) (*connect.Response[warrenv1.NodeResponse], error) {
	return c.nodeOp(ctx, req.Msg.GetId(), fsmv1.NodeOp_OP_DRAIN, int64(req.Msg.GetDeadlineSeconds()))
}

func (c clusterAPI) RemoveNode(ctx context.Context, req *connect.Request[warrenv1.NodeRequest]) (*connect.Response[warrenv1.NodeResponse], error) {
	return c.nodeOp(ctx, req.Msg.GetId(), fsmv1.NodeOp_OP_REMOVE, 0)
}
