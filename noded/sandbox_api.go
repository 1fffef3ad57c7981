package noded

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/warrenhq/warren/api"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/api/textcut"
	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/internal/atomicfile"
	"github.com/warrenhq/warren/internal/httpdeadline"
	"github.com/warrenhq/warren/internal/reqbound"
	"github.com/warrenhq/warren/noded/driver"
)

// Limits of the sandbox API on a node.
const (
	MaxFileBytes  = api.MaxSandboxFileBytes  // ReadFile and WriteFile carry a whole file
	MaxStdinBytes = api.MaxSandboxStdinBytes // an Exec's stdin, sent whole
)

// SandboxAPI serves warren.v1.SandboxService for the sandboxes of one
// node's driver. Servers forward the public API's calls to it.
type SandboxAPI struct {
	metrics *Metrics // counts claims by how they started (may be nil)
	nodeID  string
	drv     driver.Driver
	egress  *Egress // nil: sandboxes have no network
	log     *slog.Logger
	poolsAt string // where pool targets survive a restart
	// bulk bounds the file data, listings and stdin the calls hold at
	// once.
	bulk *api.BulkGate

	// mu guards pools and applying, and is held while pools.json is
	// written, so the file always holds every target set so far.
	mu    sync.Mutex
	pools map[string]int
	// applying serialises the driver's calls per template (a call may be
	// slow: the microvm driver loads the template and destroys the VMs a
	// smaller target drops), so the last one applies the latest target.
	applying map[string]*sync.Mutex
	fit      poolFit // refuses targets the node's memory cannot hold
	// direct counts the targets set directly (SetPoolTarget calls), and
	// directAt is, per template, the count at its latest: the leader's
	// session sends targets that are applied later, in turn, and one read
	// before a direct call must not undo it (see sessionMark).
	direct   uint64
	directAt map[string]uint64
}

var _ warrenv1connect.SandboxServiceHandler = (*SandboxAPI)(nil)

// NewSandboxAPI serves drv's sandboxes and restores the pool targets saved
// in dataDir.
func NewSandboxAPI(nodeID, dataDir string, drv driver.Driver, log *slog.Logger) *SandboxAPI {
	return newSandboxAPI(nodeID, dataDir, drv, log, 0)
}

// newSandboxAPI is NewSandboxAPI checking pool targets against mem bytes
// of memory (poolFit; 0: the host's), the saved ones at once.
func newSandboxAPI(nodeID, dataDir string, drv driver.Driver, log *slog.Logger, mem int64) *SandboxAPI {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &SandboxAPI{nodeID: nodeID, drv: drv, log: log, poolsAt: filepath.Join(dataDir, "pools.json"),
		pools: map[string]int{}, applying: map[string]*sync.Mutex{}, fit: poolFit{mem: mem}, directAt: map[string]uint64{},
		bulk: api.NewBulkGate(api.BulkGateBytes, api.BulkGateWait)}
	if b, err := os.ReadFile(a.poolsAt); err == nil {
		if err := json.Unmarshal(b, &a.pools); err != nil {
			log.Warn("pool targets unreadable; starting without", "err", err)
		}
		// In the templates' order, each checked with those kept before
		// it: the file may be from before targets were checked, or
		// before they were checked together.
		saved := a.pools
		a.pools = map[string]int{}
		for _, t := range slices.Sorted(maps.Keys(saved)) {
			n := saved[t]
			if n < 0 { // the file was edited, or written by something else
				log.Warn("saved pool target is negative; ignoring it", "template", t, "target", n)
				continue
			}
			if a.fit.admit(drv, nodeID, log, t, n, a.pools) != nil {
				continue
			}
			a.pools[t] = n
			drv.SetPoolTarget(t, n)
		}
	}
	return a
}

// poolFit refuses a pool target whose warm sandboxes, with those of the
// node's other pools, cannot all fit in the node's memory: the node would
// try to start them all, and each refill that fails for want of memory is
// tried again. A refusal is logged once per template and target, since the
// leader's session sends the cluster's targets again each time it opens.
type poolFit struct {
	// mem is the node's memory in bytes: the host's, or the capacity the
	// node declares when that is less (nodeMemBytes). 0 is the host's.
	mem int64

	mu   sync.Mutex
	said map[string]int // template -> the target whose refusal was logged
}

// check returns an error of kind driver.ErrInvalid naming the targets and
// the figures if the node's warm sandboxes do not fit with n of template t:
// cur holds every template's current target (t's own is replaced by n), each
// counted at its PoolMemberBytes. A driver that is no driver.PoolSizer is
// not checked, nor is a template whose size it does not know (0).
func (p *poolFit) check(drv driver.Driver, node, t string, n int, cur map[string]int) error {
	s, ok := drv.(driver.PoolSizer)
	if !ok || n <= 0 {
		return nil
	}
	if held, ok := cur[t]; ok && n <= held {
		// No more than the target held takes no more memory: a lowering
		// always passes, even where the others' recorded targets do not
		// fit (a template the driver did not have when its target came
		// counts once it is built, though its pool was never filled).
		return nil
	}
	each := s.PoolMemberBytes(t)
	if each <= 0 {
		return nil
	}
	mem := p.mem
	if mem <= 0 {
		mem = HostMemoryBytes()
	}
	if mem <= 0 {
		return nil
	}
	var others int64
	var named []string
	for _, u := range slices.Sorted(maps.Keys(cur)) {
		m := cur[u]
		if u == t || m <= 0 {
			continue
		}
		eu := s.PoolMemberBytes(u)
		if eu <= 0 {
			continue
		}
		b := mulBytes(m, eu)
		others = addBytes(others, b)
		named = append(named, fmt.Sprintf("%s: %d × %s = %s", u, m, iecBytes(eu), iecBytes(b)))
	}
	own := mulBytes(n, each)
	total := addBytes(others, own)
	if total <= mem {
		return nil
	}
	room := int64(0)
	if others < mem {
		room = (mem - others) / each
	}
	need := func(b int64) string {
		if b == math.MaxInt64 {
			return "more than " + iecBytes(mem)
		}
		return iecBytes(b)
	}
	if len(named) == 0 {
		return driver.Errorf(driver.ErrInvalid, "target %d: needs %s for %d warm sandboxes of %s; node %s has %s of memory (room for %d)",
			n, need(own), n, iecBytes(each), node, iecBytes(mem), room)
	}
	return driver.Errorf(driver.ErrInvalid, "target %d: needs %s for %d warm sandboxes of %s (%s each), %s with the node's other pools (%s); node %s has %s of memory (room for %d of %s beside them)",
		n, need(own), n, t, iecBytes(each), need(total), strings.Join(named, ", "), node, iecBytes(mem), room, t)
}

// mulBytes is n × each bytes, math.MaxInt64 past it.
func mulBytes(n int, each int64) int64 {
	if int64(n) > math.MaxInt64/each {
		return math.MaxInt64
	}
	return int64(n) * each
}

// addBytes is a + b bytes, math.MaxInt64 past it.
func addBytes(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// driverTargets is the pool targets drv has now (on a node without a
// sandbox API, which keeps no record of its own).
func driverTargets(drv driver.Driver) map[string]int {
	cur := map[string]int{}
	if p, ok := drv.(driver.Pooler); ok {
		for _, st := range p.Pools() {
			cur[st.Template] = st.Target
		}
	}
	return cur
}

// refused logs a refusal, once for each template and target.
func (p *poolFit) refused(log *slog.Logger, t string, n int, err error) {
	p.mu.Lock()
	first := p.said[t] != n
	if first {
		if p.said == nil {
			p.said = map[string]int{}
		}
		p.said[t] = n
	}
	p.mu.Unlock()
	if first {
		log.Warn("pool target refused", "template", t, "target", n, "err", err)
	}
}

// accepted forgets a template's logged refusal: the same target refused
// again later is logged again.
func (p *poolFit) accepted(t string) {
	p.mu.Lock()
	delete(p.said, t)
	p.mu.Unlock()
}

// admit is check, then refused (logged once) or accepted.
func (p *poolFit) admit(drv driver.Driver, node string, log *slog.Logger, t string, n int, cur map[string]int) error {
	if err := p.check(drv, node, t, n, cur); err != nil {
		p.refused(log, t, n, err)
		return err
	}
	p.accepted(t)
	return nil
}

// iecBytes writes a size in GiB or MiB (24 GiB, 1.5 GiB, 256 MiB).
func iecBytes(b int64) string {
	switch {
	case b >= 1<<30:
		return strings.TrimSuffix(strconv.FormatFloat(float64(b)/(1<<30), 'f', 1, 64), ".0") + " GiB"
	case b >= 1<<20:
		return strings.TrimSuffix(strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64), ".0") + " MiB"
	}
	return strconv.FormatInt(b, 10) + " B"
}

// HostMemoryBytes is the host's memory (MemTotal in /proc/meminfo), or 0
// if unknown (driver.HostMemoryBytes).
func HostMemoryBytes() int64 { return driver.HostMemoryBytes() }

// nodeMemBytes is the memory pool targets are checked against: the host's,
// or the node's declared capacity when that is less.
func nodeMemBytes(capacity int64) int64 {
	m := HostMemoryBytes()
	if capacity > 0 && (m == 0 || capacity < m) {
		m = capacity
	}
	return m
}

func truncate(s string, n int) string { return textcut.Ellipsis(s, n) }

// codeOf maps driver and guest errors to Connect codes, once. The error's
// message, which the client gets, leaves out the node's own file paths (see
// clientMessage); guestPaths are paths in the sandbox that the call named,
// which are the client's own and kept. errors.Is and errors.As still see the
// driver's error.
func codeOf(err error, guestPaths ...string) *connect.Error {
	if msg := clientMessage(err, guestPaths); msg != err.Error() {
		err = &clientError{msg: msg, err: err}
	}
	return connect.NewError(codeFor(err), err)
}

// codeOf is the package's codeOf, and logs the whole error when the
// client's message left something out.
func (a *SandboxAPI) codeOf(err error, guestPaths ...string) *connect.Error {
	ce := codeOf(err, guestPaths...)
	var c *clientError
	if errors.As(ce.Unwrap(), &c) {
		a.log.Info("sandbox call failed (the client's message leaves out the node's paths)", "code", ce.Code(), "err", err)
	}
	return ce
}

func codeFor(err error) connect.Code {
	var re *guest.RemoteError
	switch {
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded
	case errors.Is(err, driver.ErrInvalid):
		return connect.CodeInvalidArgument
	case errors.Is(err, driver.ErrNotFound):
		return connect.CodeNotFound
	case errors.Is(err, driver.ErrExists):
		return connect.CodeAlreadyExists
	case errors.Is(err, guest.ErrListTooLarge):
		// A directory of over 100,000 entries: the sandbox is fine,
		// the call cannot be answered whole.
		return connect.CodeFailedPrecondition
	case errors.Is(err, driver.ErrUnavailable):
		return connect.CodeUnavailable
	case errors.As(err, &re):
		switch {
		case strings.HasPrefix(re.Msg, "start "):
			// The command could not start ("start \"prog\": fork/exec
			// prog: no such file or directory"): the sandbox is there, so
			// not not_found, which says the sandbox is not.
			return connect.CodeFailedPrecondition
		case strings.Contains(re.Msg, "no such file or directory"):
			return connect.CodeNotFound
		case strings.Contains(re.Msg, "permission denied"):
			// The guest's own file modes refused the call (EACCES).
			return connect.CodePermissionDenied
		case strings.Contains(re.Msg, "is a directory"), strings.Contains(re.Msg, "not a directory"),
			strings.Contains(re.Msg, "over the limit"), strings.HasPrefix(re.Msg, "path"), strings.HasPrefix(re.Msg, "command"):
			return connect.CodeInvalidArgument
		}
		return connect.CodeFailedPrecondition
	}
	return connect.CodeInternal
}

// clientError is an error with the message a client gets in place of its
// own (which the node logs).
type clientError struct {
	msg string
	err error
}

func (e *clientError) Error() string { return e.msg }
func (e *clientError) Unwrap() error { return e.err }

// hostPath matches an absolute path in an error's text: a '/' at the start
// or after a space, quote, bracket, '=', ',' or ':' (QEMU's "-qmp
// unix:/var/…/qmp.sock,server=on: Failed to bind"), not followed by
// another (a URL's "//host"), up to the next such character (open
// /var/lib/warren/vms/vm-3/x: no such file).
var hostPath = regexp.MustCompile(`(^|[\s"'(\[=,:])(/[^/\s"'()\[\],:;][^\s"'()\[\],:;]*)`)

// clientMessage is err's message with the node's file paths (its state and
// template directories, QEMU's and the agents' sockets) cut to their last
// element: "open …/x: no such file or directory". They say how the host is
// laid out, which is no client's business. What the guest agent said (a
// *guest.RemoteError) is about the sandbox, the client's own, and is kept
// whole, as are guestPaths.
func clientMessage(err error, guestPaths []string) string {
	msg := err.Error()
	var re *guest.RemoteError
	if errors.As(err, &re) {
		if g := re.Error(); g != "" {
			if i := strings.Index(msg, g); i >= 0 {
				return scrubPaths(msg[:i], guestPaths) + g + scrubPaths(msg[i+len(g):], guestPaths)
			}
		}
	}
	return scrubPaths(msg, guestPaths)
}

func scrubPaths(s string, keep []string) string {
	// The paths the call named are kept whole, whatever they hold (a
	// space, a ':' or a ',' ends a match): each occurrence that stands
	// alone (not the end of a longer path) is set aside first, longest
	// first, as a NUL-delimited index no error holds.
	var kept []string
	for _, k := range slices.SortedFunc(slices.Values(keep), func(a, b string) int { return len(b) - len(a) }) {
		if k == "" {
			continue
		}
		var b strings.Builder
		last := 0
		for from := 0; ; {
			i := strings.Index(s[from:], k)
			if i < 0 {
				break
			}
			i += from
			end := i + len(k)
			if (i == 0 || strings.IndexByte(pathBefore, s[i-1]) >= 0) && (end == len(s) || strings.IndexByte(pathAfter, s[end]) >= 0) {
				b.WriteString(s[last:i])
				b.WriteString("\x00" + strconv.Itoa(len(kept)) + "\x00")
				last, from = end, end
			} else {
				from = i + 1
			}
		}
		found := last > 0
		b.WriteString(s[last:])
		if found {
			s = b.String()
			kept = append(kept, k)
		}
	}
	s = hostPath.ReplaceAllStringFunc(s, func(m string) string {
		i := strings.IndexByte(m, '/')
		return m[:i] + "…/" + filepath.Base(m[i:])
	})
	for i, k := range kept {
		s = strings.ReplaceAll(s, "\x00"+strconv.Itoa(i)+"\x00", k)
	}
	return s
}

// pathBefore and pathAfter are the characters that may come before and
// after a path in an error's text (see hostPath).
const (
	pathBefore = " \t\n\"'([=,:\x00"
	pathAfter  = " \t\n\"'()[],:;\x00"
)

func invalidArg(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))
}

// sandbox finds a live sandbox with a real guest.
func (a *SandboxAPI) sandbox(id string) (driver.Interactive, error) {
	if id == "" {
		return nil, invalidArg("sandbox_id: required")
	}
	node, err := api.SandboxNode(id)
	if err != nil {
		return nil, invalidArg("sandbox_id: %v", err)
	}
	if node != a.nodeID {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("sandbox %s is on node %s, not %s", id, node, a.nodeID))
	}
	l, ok := a.drv.(driver.Lister)
	if !ok {
		return nil, a.noSandboxes()
	}
	sb, ok := l.Get(id)
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("sandbox %s: not found (destroyed, expired, or never made)", id))
	}
	ia, ok := sb.(driver.Interactive)
	if !ok {
		return nil, a.noSandboxes()
	}
	return ia, nil
}

func (a *SandboxAPI) noSandboxes() error {
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("node %s runs the %s driver, which has no sandbox API (use microvm or container)", a.nodeID, a.drv.Name()))
}

func (a *SandboxAPI) toProto(ia driver.Interactive) *warrenv1.Sandbox {
	in := ia.Info()
	return &warrenv1.Sandbox{
		Id: in.ID, NodeId: a.nodeID, Template: in.Template, State: in.State, Start: string(in.Start),
		Limits: &warrenv1.SandboxLimits{Vcpus: uint32(in.Limits.VCPUs), MemoryMb: uint32(in.Limits.MemMB),
			DiskMb: uint32(in.Limits.DiskMB), Pids: uint32(in.Limits.Pids)},
		CreatedAt: timestamppb.New(in.Created), ExpiresAt: timestamppb.New(in.Expires),
		ClaimMs: float64(in.ClaimTime.Microseconds()) / 1000, Driver: a.drv.Name(), Accelerator: in.Accelerator,
		Egress: egressProto(ia),
	}
}

func egressProto(sb driver.Sandbox) *warrenv1.EgressPolicy {
	if n, ok := netOf(sb); ok {
		return policyToProto(n.Policy())
	}
	return nil
}

// fileProto is a guest's file as the API gives it. A name that is not
// UTF-8 gets U+FFFD for its bad bytes: a proto3 string must be UTF-8, and
// one such name made the whole listing fail to marshal.
func fileProto(f guest.FileInfo) *warrenv1.FileInfo {
	return &warrenv1.FileInfo{Name: strings.ToValidUTF8(f.Name, "\uFFFD"), Size: f.Size, Mode: f.Mode, ModifiedAt: timestamppb.New(time.Unix(0, f.ModNano)), Dir: f.Dir}
}

// CreateSandbox claims a sandbox from the driver.
func (a *SandboxAPI) CreateSandbox(ctx context.Context, req *connect.Request[warrenv1.CreateSandboxRequest]) (*connect.Response[warrenv1.CreateSandboxResponse], error) {
	m := req.Msg
	if _, ok := a.drv.(driver.Lister); !ok {
		return nil, a.noSandboxes()
	}
	id := m.GetId()
	if id == "" {
		id = api.NewSandboxID(a.nodeID)
	} else if node, err := api.SandboxNode(id); err != nil || node != a.nodeID {
		return nil, invalidArg("id %q: must be sb-XXXXXXXXXX-%s (or empty)", truncate(id, 80), a.nodeID)
	}
	if m.GetTtlSeconds() < 0 {
		return nil, invalidArg("ttl_seconds %d: must not be negative", m.GetTtlSeconds())
	}
	if m.GetTtlSeconds() > 365*24*3600 {
		return nil, invalidArg("ttl_seconds %d: over a year", m.GetTtlSeconds())
	}
	if err := guest.CheckExec([]string{"env"}, m.GetEnv()); err != nil {
		return nil, invalidArg("env: %v", err)
	}
	policy, err := policyFromProto("egress", m.GetEgress())
	if err != nil {
		return nil, invalidArg("%v", err)
	}
	if m.GetEgress() != nil && a.egress == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("egress: node %s runs without egress policy (its sandboxes have no network)", a.nodeID))
	}
	l := m.GetLimits()
	sb, err := a.drv.Claim(ctx, driver.ClaimRequest{ID: id, Template: m.GetTemplate(), TTL: time.Duration(m.GetTtlSeconds()) * time.Second,
		Env: m.GetEnv(), Limits: driver.Limits{VCPUs: int(l.GetVcpus()), MemMB: int(l.GetMemoryMb()), DiskMB: int(l.GetDiskMb()), Pids: int(l.GetPids())}})
	if err != nil {
		return nil, a.codeOf(err)
	}
	ia, ok := sb.(driver.Interactive)
	if !ok {
		_ = sb.Destroy()
		return nil, a.noSandboxes()
	}
	if err := a.egress.bind(sb, policy, nil); err != nil {
		_ = sb.Destroy()
		return nil, a.codeOf(fmt.Errorf("egress: %w", err))
	}
	if err := ctx.Err(); err != nil {
		// The caller went away while the sandbox was made (a claim's
		// last steps do not stop for it): nobody has its id, and it
		// would live out its TTL.
		_ = sb.Destroy()
		code := connect.CodeCanceled
		if errors.Is(err, context.DeadlineExceeded) {
			code = connect.CodeDeadlineExceeded
		}
		return nil, connect.NewError(code, fmt.Errorf("the caller went away while sandbox %s was made; it is destroyed", id))
	}
	a.metrics.claimed(sb)
	return connect.NewResponse(&warrenv1.CreateSandboxResponse{Sandbox: a.toProto(ia)}), nil
}

// SetEgress changes a live sandbox's egress policy.
func (a *SandboxAPI) SetEgress(ctx context.Context, req *connect.Request[warrenv1.SetEgressRequest]) (*connect.Response[warrenv1.SetEgressResponse], error) {
	ia, err := a.sandbox(req.Msg.GetSandboxId())
	if err != nil {
		return nil, err
	}
	if req.Msg.GetEgress() == nil {
		return nil, invalidArg("egress: required")
	}
	policy, err := policyFromProto("egress", req.Msg.GetEgress())
	if err != nil {
		return nil, invalidArg("%v", err)
	}
	n, ok := netOf(ia)
	if !ok {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("sandbox %s has no network (node %s runs without egress policy)", ia.ID(), a.nodeID))
	}
	if err := n.SetPolicy(policy); err != nil {
		return nil, a.codeOf(err)
	}
	a.log.Info("egress policy changed", "sandbox", ia.ID(), "profile", policy.Profile, "allow", len(policy.Allow), "prefixes", len(policy.AllowPrefixes))
	return connect.NewResponse(&warrenv1.SetEgressResponse{Sandbox: a.toProto(ia)}), nil
}

// GetSandbox describes one sandbox.
func (a *SandboxAPI) GetSandbox(ctx context.Context, req *connect.Request[warrenv1.GetSandboxRequest]) (*connect.Response[warrenv1.GetSandboxResponse], error) {
	ia, err := a.sandbox(req.Msg.GetSandboxId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&warrenv1.GetSandboxResponse{Sandbox: a.toProto(ia)}), nil
}

// ListSandboxes lists this node's sandboxes, its task actors' too: those
// name their task (task_id), as the other calls refuse their ids.
func (a *SandboxAPI) ListSandboxes(ctx context.Context, req *connect.Request[warrenv1.ListSandboxesRequest]) (*connect.Response[warrenv1.ListSandboxesResponse], error) {
	res := &warrenv1.ListSandboxesResponse{}
	if l, ok := a.drv.(driver.Lister); ok {
		for _, sb := range l.Sandboxes() {
			if ia, ok := sb.(driver.Interactive); ok {
				p := a.toProto(ia)
				p.TaskId = sandboxTask(p.GetId())
				res.Sandboxes = append(res.Sandboxes, p)
			}
		}
	}
	return connect.NewResponse(res), nil
}

// sandboxTask returns the task whose actor owns a sandbox, from its id
// (TASK-eEPOCH, as taskactor.go names it, or TASK-eEPOCH-verify-ROUND for
// its finish step's verification sandbox), or "" for an API sandbox.
func sandboxTask(id string) string {
	if strings.HasPrefix(id, "sb-") {
		return ""
	}
	// A verification sandbox of the finish step: TASK-eEPOCH-verify-ROUND.
	if j := strings.LastIndex(id, "-verify-"); j > 0 && id[j+len("-verify-"):] != "" && strings.Trim(id[j+len("-verify-"):], "0123456789") == "" {
		id = id[:j]
	}
	i := strings.LastIndex(id, "-e")
	if i <= 0 || i+2 == len(id) || strings.Trim(id[i+2:], "0123456789") != "" {
		return ""
	}
	return id[:i]
}

// DeleteSandbox destroys a sandbox.
func (a *SandboxAPI) DeleteSandbox(ctx context.Context, req *connect.Request[warrenv1.DeleteSandboxRequest]) (*connect.Response[warrenv1.DeleteSandboxResponse], error) {
	ia, err := a.sandbox(req.Msg.GetSandboxId())
	if err != nil {
		return nil, err
	}
	if err := ia.Destroy(); err != nil {
		return nil, a.codeOf(err)
	}
	a.egress.unbind(ia.ID())
	return connect.NewResponse(&warrenv1.DeleteSandboxResponse{}), nil
}

// streamWriter sends output as Exec messages.
type streamWriter struct {
	mu     *sync.Mutex
	stream *connect.ServerStream[warrenv1.ExecResponse]
	stderr bool
}

func (w streamWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := append([]byte(nil), p...)
	var m warrenv1.ExecResponse
	if w.stderr {
		m.Event = &warrenv1.ExecResponse_Stderr{Stderr: b}
	} else {
		m.Event = &warrenv1.ExecResponse_Stdout{Stdout: b}
	}
	if err := w.stream.Send(&m); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Exec runs a command and streams its output, then its exit status.
func (a *SandboxAPI) Exec(ctx context.Context, req *connect.Request[warrenv1.ExecRequest], stream *connect.ServerStream[warrenv1.ExecResponse]) error {
	m := req.Msg
	if err := guest.CheckExec(m.GetCommand(), m.GetEnv()); err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	if m.GetDir() != "" {
		if err := guest.CheckPath(m.GetDir()); err != nil {
			return invalidArg("dir: %v", err)
		}
	}
	if m.GetTimeoutMs() < 0 {
		return invalidArg("timeout_ms %d: must not be negative", m.GetTimeoutMs())
	}
	if m.GetTimeoutMs() > guest.MaxTimeoutMS {
		return invalidArg("timeout_ms %d: over the limit of %d (a year)", m.GetTimeoutMs(), int64(guest.MaxTimeoutMS))
	}
	if len(m.GetStdin()) > MaxStdinBytes {
		return invalidArg("stdin: %d bytes, over the limit of %d", len(m.GetStdin()), MaxStdinBytes)
	}
	ia, err := a.sandbox(m.GetSandboxId())
	if err != nil {
		return err
	}
	if n := len(m.GetStdin()); n > 0 {
		release, err := a.bulk.Take(ctx, "stdin", int64(n))
		if err != nil {
			return err
		}
		defer release()
	}
	gr := guest.ExecRequest{Argv: m.GetCommand(), Env: m.GetEnv(), Dir: m.GetDir(), Timeout: time.Duration(m.GetTimeoutMs()) * time.Millisecond}
	if len(m.GetStdin()) > 0 {
		gr.Stdin = bytes.NewReader(m.GetStdin())
	}
	var mu sync.Mutex
	res, err := ia.Run(ctx, gr, streamWriter{&mu, stream, false}, streamWriter{&mu, stream, true})
	if err != nil {
		return a.codeOf(err, append([]string{m.GetDir()}, m.GetCommand()...)...)
	}
	mu.Lock()
	defer mu.Unlock()
	return stream.Send(&warrenv1.ExecResponse{Event: &warrenv1.ExecResponse_Exit{Exit: &warrenv1.ExitStatus{
		Code: int32(res.ExitCode), Signal: int32(res.Signal), TimedOut: res.TimedOut, DurationUs: res.Duration.Microseconds()}}})
}

func checkPath(p string) error {
	if err := guest.CheckPath(p); err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	return nil
}

type limitedBuffer struct {
	b   []byte
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if len(l.b)+len(p) > l.max {
		return 0, fmt.Errorf("over %d bytes", l.max)
	}
	l.b = append(l.b, p...)
	return len(p), nil
}

// ReadFile returns a whole file (at most MaxFileBytes).
func (a *SandboxAPI) ReadFile(ctx context.Context, req *connect.Request[warrenv1.ReadFileRequest]) (*connect.Response[warrenv1.ReadFileResponse], error) {
	if err := checkPath(req.Msg.GetPath()); err != nil {
		return nil, err
	}
	ia, err := a.sandbox(req.Msg.GetSandboxId())
	if err != nil {
		return nil, err
	}
	// The whole file is held until it is sent: room for the largest,
	// held until the answer is written (sandboxHandler).
	release, err := a.bulk.TakeUntilSent(ctx, "read_file", MaxFileBytes)
	if err != nil {
		return nil, err
	}
	defer release()
	buf := &limitedBuffer{max: MaxFileBytes}
	fi, err := ia.ReadFile(ctx, req.Msg.GetPath(), MaxFileBytes, buf)
	if err != nil {
		return nil, a.codeOf(err, req.Msg.GetPath())
	}
	return connect.NewResponse(&warrenv1.ReadFileResponse{Data: buf.b, File: fileProto(fi)}), nil
}

// WriteFile writes a whole file, creating its parent directories.
func (a *SandboxAPI) WriteFile(ctx context.Context, req *connect.Request[warrenv1.WriteFileRequest]) (*connect.Response[warrenv1.WriteFileResponse], error) {
	if err := checkPath(req.Msg.GetPath()); err != nil {
		return nil, err
	}
	if n := len(req.Msg.GetData()); n > MaxFileBytes {
		return nil, invalidArg("data: %d bytes, over the limit of %d", n, MaxFileBytes)
	}
	if req.Msg.GetMode() > 0o7777 {
		return nil, invalidArg("mode %o: only permission bits (at most 07777)", req.Msg.GetMode())
	}
	ia, err := a.sandbox(req.Msg.GetSandboxId())
	if err != nil {
		return nil, err
	}
	release, err := a.bulk.Take(ctx, "write_file", int64(len(req.Msg.GetData())))
	if err != nil {
		return nil, err
	}
	defer release()
	// An unset mode is the guest's default (0644); a mode set to 0 is kept.
	fi, err := ia.WriteFile(ctx, req.Msg.GetPath(), req.Msg.Mode, bytes.NewReader(req.Msg.GetData()))
	if err != nil {
		return nil, a.codeOf(err, req.Msg.GetPath())
	}
	return connect.NewResponse(&warrenv1.WriteFileResponse{File: fileProto(fi)}), nil
}

// ListFiles lists a directory.
func (a *SandboxAPI) ListFiles(ctx context.Context, req *connect.Request[warrenv1.ListFilesRequest]) (*connect.Response[warrenv1.ListFilesResponse], error) {
	if err := checkPath(req.Msg.GetPath()); err != nil {
		return nil, err
	}
	ia, err := a.sandbox(req.Msg.GetSandboxId())
	if err != nil {
		return nil, err
	}
	// The listing, its messages and the answer are held until it is
	// sent: room for the largest, held until the answer is written
	// (sandboxHandler).
	release, err := a.bulk.TakeUntilSent(ctx, "list_files", api.BulkGateListBytes)
	if err != nil {
		return nil, err
	}
	defer release()
	fs, err := ia.ListFiles(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, a.codeOf(err, req.Msg.GetPath())
	}
	res := &warrenv1.ListFilesResponse{}
	for _, f := range fs {
		res.Files = append(res.Files, fileProto(f))
	}
	return connect.NewResponse(res), nil
}

// Pause saves a sandbox to disk and stops it.
func (a *SandboxAPI) Pause(ctx context.Context, req *connect.Request[warrenv1.PauseRequest]) (*connect.Response[warrenv1.PauseResponse], error) {
	ia, err := a.sandbox(req.Msg.GetSandboxId())
	if err != nil {
		return nil, err
	}
	if err := ia.Pause(ctx); err != nil {
		return nil, a.codeOf(err)
	}
	return connect.NewResponse(&warrenv1.PauseResponse{Sandbox: a.toProto(ia)}), nil
}

// Resume brings a paused sandbox back.
func (a *SandboxAPI) Resume(ctx context.Context, req *connect.Request[warrenv1.ResumeRequest]) (*connect.Response[warrenv1.ResumeResponse], error) {
	ia, err := a.sandbox(req.Msg.GetSandboxId())
	if err != nil {
		return nil, err
	}
	if err := ia.Resume(ctx); err != nil {
		return nil, a.codeOf(err)
	}
	return connect.NewResponse(&warrenv1.ResumeResponse{Sandbox: a.toProto(ia)}), nil
}

// SetPoolTarget sets and saves a template's pool target on this node.
func (a *SandboxAPI) SetPoolTarget(ctx context.Context, req *connect.Request[warrenv1.SetPoolTargetRequest]) (*connect.Response[warrenv1.SetPoolTargetResponse], error) {
	t, n := req.Msg.GetTemplate(), req.Msg.GetTarget()
	if t == "" {
		return nil, invalidArg("template: required")
	}
	if n > 1000 {
		return nil, invalidArg("target %d: over the limit of 1000 per node", n)
	}
	if _, ok := a.drv.(driver.Pooler); !ok {
		// Accepted, and a no-op: the driver has no warm pool to fill (a
		// container starts in a few hundred milliseconds). It is saved
		// and passed on as the session's targets are; the answer says
		// so rather than refusing, so that a cluster-wide `warren pool
		// set` does not report this node as failing.
		if err := a.setTarget(t, int(n), direct); err != nil {
			return nil, a.codeOf(err)
		}
		return connect.NewResponse(&warrenv1.SetPoolTargetResponse{Pools: []*warrenv1.PoolStatus{{NodeId: a.nodeID, Template: t,
			Note: fmt.Sprintf("the %s driver keeps no warm pool", a.drv.Name())}}}), nil
	}
	if l, ok := a.drv.(interface{ HasTemplate(string) error }); ok {
		if err := l.HasTemplate(t); err != nil {
			return nil, a.codeOf(err)
		}
	}
	if err := a.setTarget(t, int(n), direct); err != nil {
		return nil, a.codeOf(err)
	}
	pools, _ := a.ListPools(ctx, connect.NewRequest(&warrenv1.ListPoolsRequest{}))
	return connect.NewResponse(&warrenv1.SetPoolTargetResponse{Pools: pools.Msg.GetPools()}), nil
}

// setTarget saves a pool target in the node's data dir (so it holds from
// the next start, before the leader's session sends the cluster's) and
// applies it. Targets set at once are all saved (the file is written under
// a.mu), and the driver ends with each template's latest target (its calls
// for one template are serialised and apply the target current then),
// while a slow call for one template does not hold up another's.
//
// A target whose warm sandboxes cannot fit in the node's memory with the
// other templates' is refused (see poolFit) and changes nothing: the
// template keeps its target. It is checked against the recorded targets
// under a.mu, with the record, so two targets set at once cannot both
// take the same memory.
//
// mark says where the target comes from: direct for a SetPoolTarget call,
// else sessionMark's when the leader's session sent it. A session's
// target for a template set directly since is older than that one, and is
// skipped (decided in the same critical section that records a target, so
// no direct set can land between the check and the record).
func (a *SandboxAPI) setTarget(t string, n int, mark uint64) error {
	a.mu.Lock()
	if mark != direct && a.directAt[t] > mark {
		kept := a.pools[t]
		a.mu.Unlock()
		a.log.Info("pool target from the session skipped: set directly since", "template", t, "target", n, "kept", kept)
		return nil
	}
	if err := a.fit.admit(a.drv, a.nodeID, a.log, t, n, a.pools); err != nil {
		a.mu.Unlock()
		return err
	}
	if mark == direct {
		a.direct++
		a.directAt[t] = a.direct
	}
	if n == 0 {
		delete(a.pools, t)
	} else {
		a.pools[t] = n
	}
	err := a.savePools()
	apply := a.applying[t]
	if apply == nil {
		apply = &sync.Mutex{}
		a.applying[t] = apply
	}
	a.mu.Unlock()

	apply.Lock()
	a.mu.Lock()
	cur := a.pools[t]
	a.mu.Unlock()
	a.drv.SetPoolTarget(t, cur)
	apply.Unlock()
	a.log.Info("pool target set", "template", t, "target", n)
	return err
}

// savePools writes the pool targets to pools.json; a.mu is held.
func (a *SandboxAPI) savePools() error {
	b, _ := json.Marshal(a.pools)
	if err := os.MkdirAll(filepath.Dir(a.poolsAt), 0o755); err != nil {
		return fmt.Errorf("save pool targets: %w", err)
	}
	if err := atomicfile.WriteFile(a.poolsAt, b, 0o644); err != nil {
		return fmt.Errorf("save pool targets: %w", err)
	}
	return nil
}

// setTargets applies the cluster's complete set of pool targets, which a
// new session sends: a template this node has a target for that the set
// does not name goes to 0. Its record was removed while the node was away
// (pools.json brought the old target back at start), or it was a per-node
// target (`warren pool set T N --node ID`), which is not replicated and so
// lasts until the node's next session.
//
// mark is sessionMark's when the set came: a template set directly since
// keeps that target.
func (a *SandboxAPI) setTargets(set []*warrenv1.SetPoolTarget, mark uint64) {
	want := map[string]int{}
	for _, t := range set {
		want[t.GetTemplate()] = int(t.GetTarget())
	}
	a.mu.Lock()
	for t, n := range a.pools {
		if _, ok := want[t]; !ok {
			want[t] = 0
		} else if want[t] == n {
			delete(want, t) // set already, by the session's SetPoolTarget
		}
	}
	order := lowerFirst(want, a.pools)
	a.mu.Unlock()
	for _, t := range order {
		n := want[t]
		if err := a.setTarget(t, n, mark); errors.Is(err, driver.ErrInvalid) {
			continue // refused, and logged once by setTarget
		} else if err != nil {
			a.log.Warn("pool target not saved", "template", t, "target", n, "err", err)
		}
	}
}

// setPoolTargets applies the cluster's complete set of pool targets (see
// SandboxAPI.setTargets). A node without a sandbox API saves no targets:
// it zeroes those its driver's pools still have.
func (d *Daemon) setPoolTargets(set []*warrenv1.SetPoolTarget, mark uint64) {
	if d.Sandboxes != nil {
		d.Sandboxes.setTargets(set, mark)
		return
	}
	want := map[string]int{}
	for _, t := range set {
		want[t.GetTemplate()] = int(t.GetTarget())
	}
	// The memory the zeroed and lowered pools free first, so that the
	// raised ones fit in it (each target is checked with the others).
	cur := driverTargets(d.cfg.Driver)
	for t, n := range cur {
		if _, ok := want[t]; !ok && n > 0 {
			d.cfg.Driver.SetPoolTarget(t, 0)
		}
	}
	for _, t := range lowerFirst(want, cur) {
		d.setPoolTarget(t, want[t], mark)
	}
}

// lowerFirst orders want's templates for applying: those whose target is
// not above cur's first, then the rest, each part by name. Each target is
// checked with the others' (poolFit), so a set that moves memory from one
// template to another fits only once the lowered ones are applied.
func lowerFirst(want, cur map[string]int) []string {
	ts := slices.Sorted(maps.Keys(want))
	slices.SortStableFunc(ts, func(x, y string) int {
		rx, ry := want[x] > cur[x], want[y] > cur[y]
		switch {
		case rx == ry:
			return 0
		case rx:
			return 1
		}
		return -1
	})
	return ts
}

// setPoolTarget applies one pool target the leader's session sent: through
// the sandbox API, which saves it, or straight to the driver on a node
// without one. A target the node's memory cannot hold is refused (and
// logged once) either way. mark is sessionMark's when the target came: a
// target set directly since is kept.
func (d *Daemon) setPoolTarget(t string, n int, mark uint64) {
	if d.Sandboxes != nil {
		if err := d.Sandboxes.setTarget(t, n, mark); err != nil && !errors.Is(err, driver.ErrInvalid) { // a refusal is logged
			d.log.Warn("pool target not saved", "template", t, "target", n, "err", err)
		}
		return
	}
	if d.poolFit.admit(d.cfg.Driver, d.cfg.ID, d.log, t, n, driverTargets(d.cfg.Driver)) != nil {
		return
	}
	d.cfg.Driver.SetPoolTarget(t, n)
}

// direct is setTarget's mark for a target set by a SetPoolTarget call.
const direct = math.MaxUint64

// sessionMark marks the moment a pool target from the leader's session
// came, before it waits its turn (applyPoolsLater): a target set directly
// after it (a SetPoolTarget call, as `warren pool set` makes) is newer, and
// the session's, read from the cluster's state earlier, does not undo it.
// Without a sandbox API nothing is set directly.
func (d *Daemon) sessionMark() uint64 {
	if d.Sandboxes == nil {
		return 0
	}
	d.Sandboxes.mu.Lock()
	defer d.Sandboxes.mu.Unlock()
	return d.Sandboxes.direct
}

// ListPools reports this node's pools. A snapshot's status may be why
// making or loading one failed, in the driver's words: the node's paths
// in it are cut to their last element, as in every error (the node's log
// has them whole).
func (a *SandboxAPI) ListPools(ctx context.Context, req *connect.Request[warrenv1.ListPoolsRequest]) (*connect.Response[warrenv1.ListPoolsResponse], error) {
	res := &warrenv1.ListPoolsResponse{}
	if p, ok := a.drv.(driver.Pooler); ok {
		for _, st := range p.Pools() {
			res.Pools = append(res.Pools, &warrenv1.PoolStatus{NodeId: a.nodeID, Template: st.Template, Target: uint32(st.Target),
				Ready: uint32(st.Ready), Filling: uint32(st.Filling), Snapshot: scrubPaths(st.Snapshot, nil), Standby: uint32(st.Standby)})
		}
	}
	return connect.NewResponse(res), nil
}

var _ io.Writer = (*limitedBuffer)(nil)

// serveSandboxes starts the node's SandboxService listener.
func (d *Daemon) serveSandboxes() error {
	host, _, err := net.SplitHostPort(d.cfg.SandboxListen)
	if err != nil {
		return fmt.Errorf("sandbox-listen: %q is not HOST:PORT: %v", d.cfg.SandboxListen, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return fmt.Errorf("sandbox-listen: give the address servers reach this node at, not %q", host)
	}
	ln, err := net.Listen("tcp", d.cfg.SandboxListen)
	if err != nil {
		return fmt.Errorf("sandbox-listen: %w", err)
	}
	d.Sandboxes = newSandboxAPI(d.cfg.ID, d.cfg.DataDir, d.cfg.Driver, d.log, nodeMemBytes(d.cfg.Capacity.GetMemoryBytes()))
	d.Sandboxes.metrics = d.cfg.Metrics
	d.Sandboxes.egress = d.cfg.Egress
	hs := &http.Server{Handler: sandboxHandler(d.Sandboxes), ReadHeaderTimeout: 10 * time.Second}
	hs.Protocols = new(http.Protocols)
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	d.sandboxSrv = hs
	d.sandboxURL = "http://" + ln.Addr().String()
	d.cfg.Egress.denyPort(ln.Addr().String()) // sandboxes never reach a node's sandbox API
	go hs.Serve(ln)
	d.log.Info("sandbox API listening", "url", d.sandboxURL)
	return nil
}

// sandboxHandler serves a node's SandboxService. Lists are counted before
// a request is decoded: a few MB of empty command arguments, gzipped to a
// few KB, decoded to GBs before validation refused them. A ReadFile's and
// a ListFiles' room in the gate is held until the answer is written
// (api.HoldUntilServed). Each write of an Exec's output, and of those
// answers, has sandboxWriteTimeout: a client that stops reading would
// otherwise hold the call for good, with the command's call to its guest,
// or the answer and its room in the gate.
func sandboxHandler(a *SandboxAPI) http.Handler {
	mux := http.NewServeMux()
	path, h := warrenv1connect.NewSandboxServiceHandler(a, connect.WithReadMaxBytes(api.MaxSandboxRequestBytes), reqbound.Codecs(reqbound.Sandbox))
	mux.Handle(path, api.HoldUntilServed(h))
	return httpdeadline.For(mux, func() time.Duration { return sandboxWriteTimeout }, warrenv1connect.SandboxServiceExecProcedure,
		warrenv1connect.SandboxServiceReadFileProcedure, warrenv1connect.SandboxServiceListFilesProcedure)
}

// sandboxWriteTimeout bounds each write of an Exec's output, and of a
// ReadFile's or a ListFiles' answer (each MiB of it), to its client (a
// variable for tests).
var sandboxWriteTimeout = 30 * time.Second

// SandboxURL is where the node serves its SandboxService ("" if it does not).
func (d *Daemon) SandboxURL() string { return d.sandboxURL }
