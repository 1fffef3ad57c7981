package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/warrenhq/warren/api"
	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// sandboxAPI is the public SandboxService on a server: it picks a node for
// a new sandbox and forwards every other call to the node its id names.
// Sandboxes live on their nodes; the servers keep no record of them.
type sandboxAPI struct {
	s    *Server
	http *http.Client

	// bulk bounds the file data, listings and stdin the forwarded calls
	// hold at once (each is decoded here, sent on and its answer decoded
	// again).
	bulk *api.BulkGate

	mu      sync.Mutex
	clients map[string]warrenv1connect.SandboxServiceClient
}

var _ warrenv1connect.SandboxServiceHandler = (*sandboxAPI)(nil)

func newSandboxAPI(s *Server) *sandboxAPI {
	return &sandboxAPI{s: s, http: &http.Client{}, clients: map[string]warrenv1connect.SandboxServiceClient{},
		bulk: api.NewBulkGate(api.BulkGateBytes, api.BulkGateWait)}
}

func (a *sandboxAPI) client(url string) warrenv1connect.SandboxServiceClient {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.clients[url]
	if !ok {
		c = warrenv1connect.NewSandboxServiceClient(a.http, url)
		a.clients[url] = c
	}
	return c
}

// sandboxNode returns the node a sandbox id names, if it can take calls.
func (a *sandboxAPI) sandboxNode(id string) (*warrenv1.Node, error) {
	var p problems
	if id == "" {
		p.add("sandbox_id", "required")
		return nil, invalid(p.err())
	}
	node, err := api.SandboxNode(id)
	if err != nil {
		p.add("sandbox_id", "%v", err)
		return nil, invalid(p.err())
	}
	// Checked as a node id, so an error does not echo an arbitrary
	// string (of any length) back as a node's name.
	if !reNodeID.MatchString(node) {
		p.add("sandbox_id", "%q: names no possible node (sb-XXXXXXXXXX-NODE, NODE 1-63 of a-z, 0-9, '.', '_', '-')", truncate(id, 80))
		return nil, invalid(p.err())
	}
	return a.node(node)
}

func (a *sandboxAPI) node(id string) (*warrenv1.Node, error) {
	nodes, err := a.s.readNodes()
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if n.GetId() != id {
			continue
		}
		switch {
		case n.GetSandboxUrl() == "":
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("node %s serves no sandboxes (driver %v)", id, n.GetDrivers()))
		case n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_DOWN:
			return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("node %s is down (%s)", id, n.GetStatusReason()))
		}
		return n, nil
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("node %s: not in the cluster", id))
}

// forwardErr names the node in a transport failure; the node's own
// answers pass through unchanged.
func forwardErr(n *warrenv1.Node, err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) && ce.Code() == connect.CodeUnavailable {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("node %s at %s: %v", n.GetId(), n.GetSandboxUrl(), ce.Message()))
	}
	return err
}

// templateName strips "@version".
func templateName(t string) string {
	name, _, _ := strings.Cut(t, "@")
	return name
}

// validTemplateRef reports whether t is a template name, or a name and a
// version (NAME@VERSION), each a plain name: a version names a directory
// of the node's template store, so it must not leave it.
func validTemplateRef(t string) bool {
	name, version, hasVersion := strings.Cut(t, "@")
	return reTemplate.MatchString(name) && (!hasVersion || reTemplate.MatchString(version))
}

// CreateSandbox places the sandbox on a ready node that runs sandboxes and
// has the template, and forwards the call with an id that names the node.
func (a *sandboxAPI) CreateSandbox(ctx context.Context, req *connect.Request[warrenv1.CreateSandboxRequest]) (*connect.Response[warrenv1.CreateSandboxResponse], error) {
	m := req.Msg
	var p problems
	if t := m.GetTemplate(); t != "" && !validTemplateRef(t) {
		p.add("template", "%q must be NAME or NAME@VERSION, each 1-128 of a-z, 0-9, '.', '_', '-'", truncate(t, 80))
	}
	if m.GetId() != "" {
		p.add("id", "set by the server; leave it empty")
	}
	if m.GetNodeId() != "" {
		p.nodeID("node_id", m.GetNodeId())
	}
	p.addErr(api.CheckSandboxRequestSize(m))
	if err := p.err(); err != nil {
		return nil, invalid(err)
	}
	var n *warrenv1.Node
	var err error
	if m.GetNodeId() != "" {
		if n, err = a.node(m.GetNodeId()); err != nil {
			return nil, err
		}
		// A node named outright is held to what pick asks of any node:
		// a cordoned or draining one takes no new work.
		switch {
		case n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_DRAINING:
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("node %s is draining: it takes no new sandboxes", n.GetId()))
		case !n.GetEligible():
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("node %s is cordoned: it takes no new sandboxes (warren nodes uncordon %s)", n.GetId(), n.GetId()))
		}
	} else if n, err = a.pick(templateName(m.GetTemplate())); err != nil {
		return nil, err
	}
	fwd := proto.Clone(m).(*warrenv1.CreateSandboxRequest)
	fwd.Id = api.NewSandboxID(n.GetId())
	res, err := a.client(n.GetSandboxUrl()).CreateSandbox(ctx, connect.NewRequest(fwd))
	if err != nil {
		return nil, forwardErr(n, err)
	}
	return res, nil
}

// pick chooses a node at random among those that can take the sandbox.
func (a *sandboxAPI) pick(template string) (*warrenv1.Node, error) {
	nodes, err := a.s.readNodes()
	if err != nil {
		return nil, err
	}
	var ok []*warrenv1.Node
	sandboxNodes := 0
	for _, n := range nodes {
		if n.GetSandboxUrl() == "" || n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_READY || !n.GetEligible() {
			continue
		}
		sandboxNodes++
		if template != "" && len(n.GetTemplates()) > 0 && !slices.Contains(n.GetTemplates(), template) {
			continue
		}
		ok = append(ok, n)
	}
	switch {
	case len(ok) > 0:
		return ok[rand.IntN(len(ok))], nil
	case sandboxNodes == 0:
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("no ready node runs sandboxes (start one with --driver microvm or container)"))
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("template %q: no ready node has it", template))
}

// target checks a request's size and returns the node its sandbox id
// names.
func (a *sandboxAPI) target(id string, m proto.Message) (*warrenv1.Node, error) {
	if err := api.CheckSandboxRequestSize(m); err != nil {
		return nil, invalid(err)
	}
	return a.sandboxNode(id)
}

// forward sends a unary call to the node the request's sandbox id names.
func forward[Req, Res any](a *sandboxAPI, ctx context.Context, id string, req *connect.Request[Req],
	call func(warrenv1connect.SandboxServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) (*connect.Response[Res], error) {
	n, err := a.target(id, any(req.Msg).(proto.Message))
	if err != nil {
		return nil, err
	}
	res, err := call(a.client(n.GetSandboxUrl()), ctx, connect.NewRequest(req.Msg))
	return res, forwardErr(n, err)
}

// forwardBulk is forward for a call that holds size bytes of the gate
// (what names it), taken with take (the gate's Take or TakeUntilSent).
// The request is checked, and its node found, before the call waits for
// room: with the gate busy, a bad id was refused only after the gate's
// wait, as resource_exhausted.
func forwardBulk[Req, Res any](a *sandboxAPI, ctx context.Context, id string, req *connect.Request[Req],
	take func(ctx context.Context, what string, n int64) (func(), error), what string, size int64,
	call func(warrenv1connect.SandboxServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) (*connect.Response[Res], error) {
	n, err := a.target(id, any(req.Msg).(proto.Message))
	if err != nil {
		return nil, err
	}
	release, err := take(ctx, what, size)
	if err != nil {
		return nil, err
	}
	defer release()
	res, err := call(a.client(n.GetSandboxUrl()), ctx, connect.NewRequest(req.Msg))
	return res, forwardErr(n, err)
}

// GetSandbox forwards to the sandbox's node.
func (a *sandboxAPI) GetSandbox(ctx context.Context, req *connect.Request[warrenv1.GetSandboxRequest]) (*connect.Response[warrenv1.GetSandboxResponse], error) {
	return forward(a, ctx, req.Msg.GetSandboxId(), req, warrenv1connect.SandboxServiceClient.GetSandbox)
}

// DeleteSandbox forwards to the sandbox's node.
func (a *sandboxAPI) DeleteSandbox(ctx context.Context, req *connect.Request[warrenv1.DeleteSandboxRequest]) (*connect.Response[warrenv1.DeleteSandboxResponse], error) {
	return forward(a, ctx, req.Msg.GetSandboxId(), req, warrenv1connect.SandboxServiceClient.DeleteSandbox)
}

// Exec forwards the command and relays its output.
func (a *sandboxAPI) Exec(ctx context.Context, req *connect.Request[warrenv1.ExecRequest], stream *connect.ServerStream[warrenv1.ExecResponse]) error {
	// Checked here as on the node: a call the node would refuse is not
	// forwarded (this server takes larger messages than a node does, and
	// a node refusing a message's size names no field).
	if n := len(req.Msg.GetStdin()); n > api.MaxSandboxStdinBytes {
		return invalid(fmt.Errorf("stdin: %d bytes, over the limit of %d", n, api.MaxSandboxStdinBytes))
	}
	if err := api.CheckSandboxRequestSize(req.Msg); err != nil {
		return invalid(err)
	}
	n, err := a.sandboxNode(req.Msg.GetSandboxId())
	if err != nil {
		return err
	}
	if size := len(req.Msg.GetStdin()); size > 0 {
		release, err := a.bulk.Take(ctx, "stdin", int64(size))
		if err != nil {
			return err
		}
		defer release()
	}
	up, err := a.client(n.GetSandboxUrl()).Exec(ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return forwardErr(n, err)
	}
	defer up.Close()
	for up.Receive() {
		if err := stream.Send(up.Msg()); err != nil {
			return err
		}
	}
	return forwardErr(n, up.Err())
}

// ReadFile forwards to the sandbox's node.
func (a *sandboxAPI) ReadFile(ctx context.Context, req *connect.Request[warrenv1.ReadFileRequest]) (*connect.Response[warrenv1.ReadFileResponse], error) {
	// The whole file is held here until it is sent: room for the largest,
	// held until the answer is written (sandboxHandler).
	return forwardBulk(a, ctx, req.Msg.GetSandboxId(), req, a.bulk.TakeUntilSent, "read_file", api.MaxSandboxFileBytes, warrenv1connect.SandboxServiceClient.ReadFile)
}

// WriteFile forwards to the sandbox's node.
func (a *sandboxAPI) WriteFile(ctx context.Context, req *connect.Request[warrenv1.WriteFileRequest]) (*connect.Response[warrenv1.WriteFileResponse], error) {
	if n := len(req.Msg.GetData()); n > api.MaxSandboxFileBytes {
		return nil, invalid(fmt.Errorf("data: %d bytes, over the limit of %d", n, api.MaxSandboxFileBytes))
	}
	return forwardBulk(a, ctx, req.Msg.GetSandboxId(), req, a.bulk.Take, "write_file", int64(len(req.Msg.GetData())), warrenv1connect.SandboxServiceClient.WriteFile)
}

// ListFiles forwards to the sandbox's node.
func (a *sandboxAPI) ListFiles(ctx context.Context, req *connect.Request[warrenv1.ListFilesRequest]) (*connect.Response[warrenv1.ListFilesResponse], error) {
	// The node's answer is held here, read, decoded and sent on: room for
	// the largest, held until the answer is written (sandboxHandler).
	return forwardBulk(a, ctx, req.Msg.GetSandboxId(), req, a.bulk.TakeUntilSent, "list_files", api.BulkGateListBytes, warrenv1connect.SandboxServiceClient.ListFiles)
}

// Pause forwards to the sandbox's node.
func (a *sandboxAPI) Pause(ctx context.Context, req *connect.Request[warrenv1.PauseRequest]) (*connect.Response[warrenv1.PauseResponse], error) {
	return forward(a, ctx, req.Msg.GetSandboxId(), req, warrenv1connect.SandboxServiceClient.Pause)
}

// SetEgress forwards to the sandbox's node.
func (a *sandboxAPI) SetEgress(ctx context.Context, req *connect.Request[warrenv1.SetEgressRequest]) (*connect.Response[warrenv1.SetEgressResponse], error) {
	return forward(a, ctx, req.Msg.GetSandboxId(), req, warrenv1connect.SandboxServiceClient.SetEgress)
}

// Resume forwards to the sandbox's node.
func (a *sandboxAPI) Resume(ctx context.Context, req *connect.Request[warrenv1.ResumeRequest]) (*connect.Response[warrenv1.ResumeResponse], error) {
	return forward(a, ctx, req.Msg.GetSandboxId(), req, warrenv1connect.SandboxServiceClient.Resume)
}

// fanOut calls f on every sandbox node (or the one named), concurrently,
// and reports the nodes that failed ("NODE: error"), apart: those that did
// not answer (unreachable), and those that answered with an error of
// their own (refused, with their reason).
func (a *sandboxAPI) fanOut(ctx context.Context, only string, f func(ctx context.Context, n *warrenv1.Node) error) (unreachable, refused []string, err error) {
	if only != "" {
		var p problems
		if p.nodeID("node_id", only); p.err() != nil {
			return nil, nil, invalid(p.err())
		}
		n, err := a.node(only)
		if err != nil {
			return nil, nil, err
		}
		return nil, nil, forwardErr(n, f(ctx, n))
	}
	nodes, err := a.s.readNodes()
	if err != nil {
		return nil, nil, err
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range nodes {
		if n.GetSandboxUrl() == "" || n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_DOWN {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := f(cctx, n); err != nil {
				mu.Lock()
				// A wire error is the node's own answer; any other
				// (refused connection, timeout) the client made up.
				if connect.IsWireError(err) {
					refused = append(refused, n.GetId()+": "+err.Error())
				} else {
					unreachable = append(unreachable, n.GetId()+": "+err.Error())
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Strings(unreachable)
	sort.Strings(refused)
	return unreachable, refused, nil
}

// ListSandboxes asks every sandbox node (or the one named).
func (a *sandboxAPI) ListSandboxes(ctx context.Context, req *connect.Request[warrenv1.ListSandboxesRequest]) (*connect.Response[warrenv1.ListSandboxesResponse], error) {
	var mu sync.Mutex
	out := &warrenv1.ListSandboxesResponse{}
	unreachable, refused, err := a.fanOut(ctx, req.Msg.GetNodeId(), func(ctx context.Context, n *warrenv1.Node) error {
		res, err := a.client(n.GetSandboxUrl()).ListSandboxes(ctx, connect.NewRequest(&warrenv1.ListSandboxesRequest{}))
		if err != nil {
			return err
		}
		mu.Lock()
		out.Sandboxes = append(out.Sandboxes, res.Msg.GetSandboxes()...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out.Sandboxes, func(i, j int) bool { return out.Sandboxes[i].GetId() < out.Sandboxes[j].GetId() })
	if req.Msg.GetNodeId() == "" {
		// A node marked down is not asked, but one only cut off from the
		// servers still runs its sandboxes (it enforces their TTLs): the
		// list says whose are missing rather than leaving them out quietly.
		nodes, err := a.s.readNodes()
		if err != nil {
			return nil, err
		}
		for _, n := range nodes {
			if n.GetSandboxUrl() != "" && n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_DOWN {
				unreachable = append(unreachable, n.GetId()+": marked down, not asked; its sandboxes, if it still runs them, are not listed")
			}
		}
		sort.Strings(unreachable)
	}
	out.UnreachableNodes, out.RefusedNodes = unreachable, refused
	return connect.NewResponse(out), nil
}

// validatePool checks a warm-pool target.
func validatePool(template string, target uint32) error {
	var p problems
	if !reTemplate.MatchString(template) {
		p.add("template", "%q must be 1-128 of a-z, 0-9, '.', '_', '-'", truncate(template, 80))
	}
	if target > 1000 {
		p.add("target", "%d is over the limit of 1000 per node", target)
	}
	return p.err()
}

// SetPoolTarget sets the target on every sandbox node (or the one named).
func (a *sandboxAPI) SetPoolTarget(ctx context.Context, req *connect.Request[warrenv1.SetPoolTargetRequest]) (*connect.Response[warrenv1.SetPoolTargetResponse], error) {
	if err := validatePool(req.Msg.GetTemplate(), req.Msg.GetTarget()); err != nil {
		return nil, invalid(err)
	}
	// The cluster's target (no node named) is kept in the replicated state
	// and sent to every node when its session opens (nodes that join later
	// too). A target of 0 is recorded first. Any other is recorded after
	// the nodes answer, and only if one took it or none refused it: a
	// template every answering node refuses (a typo) would otherwise stay
	// in the record, unseen, sent to every node at each session open.
	pool := &fsmv1.SetPool{Template: req.Msg.GetTemplate(), Target: req.Msg.GetTarget()}
	cluster := req.Msg.GetNodeId() == ""
	if cluster && pool.GetTarget() == 0 {
		if _, err := (taskAPI{a.s}).write(ctx, pool); err != nil {
			return nil, err
		}
	}
	var mu sync.Mutex
	took := 0
	out := &warrenv1.SetPoolTargetResponse{}
	unreachable, refused, err := a.fanOut(ctx, req.Msg.GetNodeId(), func(ctx context.Context, n *warrenv1.Node) error {
		res, err := a.client(n.GetSandboxUrl()).SetPoolTarget(ctx, connect.NewRequest(req.Msg))
		if err != nil {
			return err
		}
		mu.Lock()
		took++
		out.Pools = append(out.Pools, res.Msg.GetPools()...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	if cluster && pool.GetTarget() > 0 {
		if took == 0 && len(refused) > 0 {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
				"template %q: every node that answered refused the pool target (%s); the cluster's target is not set",
				pool.GetTemplate(), strings.Join(refused, "; ")))
		}
		if _, err := (taskAPI{a.s}).write(ctx, pool); err != nil {
			if took == 0 {
				return nil, err
			}
			// The nodes that took it keep it (and fill the pool) until
			// their next session sets the cluster's target again: say so,
			// and that the same call again records it.
			return nil, connect.NewError(connect.CodeOf(err), fmt.Errorf(
				"template %q: %d node(s) took the pool target, but recording it as the cluster's failed: %w; they keep it until their next session with the servers: set it again",
				pool.GetTemplate(), took, err))
		}
	}
	sortPools(out.Pools)
	out.UnreachableNodes, out.RefusedNodes = unreachable, refused
	return connect.NewResponse(out), nil
}

// ListPools asks every sandbox node (or the one named).
func (a *sandboxAPI) ListPools(ctx context.Context, req *connect.Request[warrenv1.ListPoolsRequest]) (*connect.Response[warrenv1.ListPoolsResponse], error) {
	var mu sync.Mutex
	out := &warrenv1.ListPoolsResponse{}
	unreachable, refused, err := a.fanOut(ctx, req.Msg.GetNodeId(), func(ctx context.Context, n *warrenv1.Node) error {
		res, err := a.client(n.GetSandboxUrl()).ListPools(ctx, connect.NewRequest(&warrenv1.ListPoolsRequest{}))
		if err != nil {
			return err
		}
		mu.Lock()
		out.Pools = append(out.Pools, res.Msg.GetPools()...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	sortPools(out.Pools)
	out.UnreachableNodes, out.RefusedNodes = unreachable, refused
	return connect.NewResponse(out), nil
}

func sortPools(ps []*warrenv1.PoolStatus) {
	sort.Slice(ps, func(i, j int) bool {
		if ps[i].GetNodeId() != ps[j].GetNodeId() {
			return ps[i].GetNodeId() < ps[j].GetNodeId()
		}
		return ps[i].GetTemplate() < ps[j].GetTemplate()
	})
}
