package scheduler

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/warrenhq/warren/api"
	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/textcut"
)

// Limits on request fields. Every bad field is reported by name.
const (
	maxRequestID   = 128
	maxRepo        = 2048
	maxRev         = 256
	maxTitle       = 512
	maxBody        = 256 << 10
	maxModel       = 128
	maxEgress      = 256
	maxLabels      = 64
	maxPolicyRules = 64
	maxRulePattern = 1024
	maxLabelValue  = 256
	maxTestCommand = 4096
	maxMessage     = 32 << 10
	maxComment     = 4096
	maxPageSize    = 1000
)

var (
	reTenant   = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	reModel    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/@-]*$`)
	reTemplate = api.TemplateNameRE
	reLabelKey = regexp.MustCompile(`^[a-z0-9][a-z0-9./_-]{0,62}$`)
	reHostName = regexp.MustCompile(`^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	reScpLike  = api.ScpLikeRepo
)

// problems collects field errors so a request learns all of them at once:
// the first maxProblems of them. A request of millions of bad entries got
// an error of one line each, built in memory and sent back (a 1 MiB
// request, a 25 MB error).
type problems []error

// maxProblems is how many problems one error lists.
const maxProblems = 20

// errMoreProblems ends a list that was cut at maxProblems.
var errMoreProblems = errors.New("(further problems not listed)")

func (p *problems) add(field, format string, args ...any) {
	if p.full() {
		return
	}
	*p = append(*p, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
}

// addErr adds err (nil is nothing).
func (p *problems) addErr(err error) {
	if err != nil && !p.full() {
		*p = append(*p, err)
	}
}

// full reports whether the list holds maxProblems problems, marking it cut
// the first time.
func (p *problems) full() bool {
	switch {
	case len(*p) < maxProblems:
		return false
	case len(*p) == maxProblems:
		*p = append(*p, errMoreProblems)
	}
	return true
}

func (p problems) err() error { return errors.Join(p...) }

func (p *problems) text(field, v string, required bool, max int, oneLine bool) {
	switch {
	case v == "" && required:
		p.add(field, "required")
	case len(v) > max:
		p.add(field, "%d bytes is over the %d-byte limit", len(v), max)
	case !utf8.ValidString(v):
		p.add(field, "not valid UTF-8")
	case strings.ContainsFunc(v, func(r rune) bool {
		return unicode.IsControl(r) && (oneLine || (r != '\n' && r != '\t' && r != '\r'))
	}):
		p.add(field, "contains control characters")
	}
}

func (p *problems) requestID(v string) {
	p.text("request_id", v, false, maxRequestID, true)
}

func (p *problems) taskID(field, v string) {
	if v == "" {
		p.add(field, "required")
		return
	}
	if isTaskID(v) {
		return
	}
	if u, err := ulid.ParseStrict(v); err != nil {
		p.add(field, "%q is not a task id (a 26-character ULID)", truncate(v, 40))
	} else {
		// Ids are stored as written: another spelling would find nothing.
		p.add(field, "%q: task ids are upper case (%s)", v, u.String())
	}
}

// isTaskID reports whether id is a task id in the one spelling ids are
// made and stored in: a ULID's 26 upper-case characters. Event keys are
// the id and then the seq, with no separator, so any other id could put
// one task's keys among another's.
func isTaskID(id string) bool {
	u, err := ulid.ParseStrict(id)
	return err == nil && u.String() == id
}

func truncate(s string, n int) string { return textcut.Ellipsis(s, n) }

func validateCreate(r *warrenv1.CreateTaskRequest) error {
	var p problems
	p.requestID(r.GetRequestId())
	if t := r.GetTenant(); t != "" && !reTenant.MatchString(t) {
		p.add("tenant", "%q must be 1-63 of a-z, 0-9, '-', '_', starting with a letter or digit", truncate(t, 80))
	}
	s := r.GetSpec()
	if s == nil {
		p.add("spec", "required")
		return p.err()
	}
	// A task's spec is stored as it came, in the log, the task record
	// and every snapshot, and sent to its node at every start: fields this
	// server does not know would be kept and sent along unchecked and
	// unbounded (8 MiB in one unknown field was stored and read back).
	if field, num, ok := unknownField(s.ProtoReflect(), "spec"); ok {
		p.add(field, "holds field number %d, which this server does not know: leave it out, or upgrade the servers", num)
	}
	p.repo(s.GetRepo())
	p.rev("spec.base", s.GetBase())
	p.text("spec.issue_title", s.GetIssueTitle(), true, maxTitle, true)
	p.text("spec.issue_body", s.GetIssueBody(), false, maxBody, false)
	if m := s.GetModel(); m != "" && (len(m) > maxModel || !reModel.MatchString(m)) {
		p.add("spec.model", "%q is not a model name", truncate(m, 80))
	}
	if b := s.GetBudgets(); b != nil {
		for name, v := range map[string]int64{
			"max_steps": b.GetMaxSteps(), "max_tokens": b.GetMaxTokens(),
			"max_cost_micro_usd": b.GetMaxCostMicroUsd(), "max_wall_clock_seconds": b.GetMaxWallClockSeconds(),
		} {
			if v < 0 {
				p.add("spec.budgets."+name, "must not be negative, got %d", v)
			}
		}
		// In seconds, as a Duration on the node: past about 292 years it
		// would wrap to almost nothing. A year is as good as none.
		if v := b.GetMaxWallClockSeconds(); v > MaxWallClockSeconds {
			p.add("spec.budgets.max_wall_clock_seconds", "%d is over the limit of %d (a year; 0 is none)", v, MaxWallClockSeconds)
		}
	}
	if n := len(s.GetEgressAllow()); n > maxEgress {
		p.add("spec.egress_allow", "%d entries is over the limit of %d", n, maxEgress)
	}
	for i, h := range s.GetEgressAllow() {
		if i == maxEgress {
			break // (refused above: the rest is not worth checking)
		}
		if len(h) > 253 || !reHostName.MatchString(h) {
			p.add(fmt.Sprintf("spec.egress_allow[%d]", i), "%q is not a lower-case host name or *.suffix", truncate(h, 80))
		}
	}
	if n := len(s.GetModelScript()); n > 1<<20 {
		p.add("spec.model_script", "%d bytes is over the limit of 1 MiB", n)
	} else if line, ok := scriptLinesAreObjects(s.GetModelScript()); !ok {
		// The rest (the turns' fields) is the node's to check, whose
		// agent reads the script.
		p.add("spec.model_script", "line %d is not a JSON object (the script is JSON Lines, one assistant turn a line; blank lines and lines starting with # are skipped)", line)
	}
	if s.GetModel() == "scripted" && s.GetModelScript() == "" && s.GetScript() == nil {
		p.add("spec.model_script", "required with model \"scripted\"")
	}
	// A model_script runs instead of any model: a task that also names a
	// real one would silently never call it.
	if m := s.GetModel(); s.GetModelScript() != "" && m != "" && m != "scripted" {
		p.add("spec.model", "%q with a model_script, which calls no model: set model to \"scripted\" or leave it empty", truncate(m, 80))
	}
	switch s.GetEgressProfile() {
	case "", "registries", "custom":
	case "none":
		if len(s.GetEgressAllow()) > 0 {
			p.add("spec.egress_profile", "\"none\" allows nothing, but spec.egress_allow has %d entries", len(s.GetEgressAllow()))
		}
	default:
		p.add("spec.egress_profile", "%q is not registries, custom or none", truncate(s.GetEgressProfile(), 40))
	}
	if t := s.GetTemplate(); t != "" && !reTemplate.MatchString(t) {
		p.add("spec.template", "%q must be 1-128 of a-z, 0-9, '.', '_', '-'", truncate(t, 80))
	}
	p.labels("spec.labels", s.GetLabels())
	p.labels("spec.node_selector", s.GetNodeSelector())
	if n := len(s.GetPolicy()); n > maxPolicyRules {
		p.add("spec.policy", "%d rules is over the limit of %d", n, maxPolicyRules)
	}
	for i, r := range s.GetPolicy() {
		if i == maxPolicyRules {
			break // (refused above: the rest is not worth checking)
		}
		f := fmt.Sprintf("spec.policy[%d]", i)
		switch r.GetTier() {
		case "allow", "approve", "deny":
		default:
			p.add(f+".tier", "%q is not allow, approve or deny", truncate(r.GetTier(), 40))
		}
		if t := r.GetTool(); t != "" && t != "*" && !slices.Contains(api.AgentTools, t) {
			p.add(f+".tool", "%q is not one of %s or *", truncate(t, 40), strings.Join(api.AgentTools, ", "))
		}
		if g := r.GetPath(); strings.HasPrefix(g, "/") || strings.Contains(g, "..") {
			p.add(f+".path", "%q: want a glob relative to the repository root, without ..", truncate(g, 80))
		}
		p.text(f+".path", r.GetPath(), false, maxRulePattern, false)
		p.text(f+".command", r.GetCommand(), false, maxRulePattern, false)
		// Compiled only within the limit (8 MiB of pattern took 0.75 s),
		// and the error, which quotes the pattern, cut.
		if c := r.GetCommand(); len(c) <= maxRulePattern {
			if _, err := regexp.Compile(c); err != nil {
				p.add(f+".command", "not an RE2 regular expression: %s", truncate(err.Error(), 200))
			}
		}
		p.text(f+".reason", r.GetReason(), false, maxComment, false)
	}
	p.text("spec.test_command", s.GetTestCommand(), false, maxTestCommand, false)
	if r := s.GetResources(); r.GetMilliCpu() < 0 || r.GetMilliCpu() > MaxTaskMilliCPU {
		p.add("spec.resources.milli_cpu", "must be 0 (the default, %dm) or up to %d, got %d", DefaultTaskMilliCPU, MaxTaskMilliCPU, r.GetMilliCpu())
	}
	if b := s.GetResources().GetMemoryBytes(); b != 0 && (b < MinTaskMemoryBytes || b > MaxTaskMemoryBytes) {
		p.add("spec.resources.memory_bytes", "must be 0 (the default) or from %d (128 MiB) to %d (64 GiB), got %d", MinTaskMemoryBytes, MaxTaskMemoryBytes, b)
	}
	if d := s.GetDriver(); d != "" && !slices.Contains(Drivers, d) {
		p.add("spec.driver", "%q is not one of %v", truncate(d, 40), Drivers)
	}
	if sc := s.GetScript(); sc != nil {
		if sc.GetSteps() < 1 || sc.GetSteps() > MaxScriptSteps {
			p.add("spec.script.steps", "must be 1..%d, got %d", MaxScriptSteps, sc.GetSteps())
		}
		if sc.GetStepMillis() > maxScriptStepMillis {
			p.add("spec.script.step_millis", "must be at most %d, got %d", maxScriptStepMillis, sc.GetStepMillis())
		}
		if sc.GetOutputBytes() > maxScriptOutput {
			p.add("spec.script.output_bytes", "must be at most %d, got %d", maxScriptOutput, sc.GetOutputBytes())
		}
		p.text("spec.script.command", sc.GetCommand(), false, maxTestCommand, false)
	}
	return p.err()
}

// MaxWallClockSeconds bounds a task's wall-clock budget: a year.
const MaxWallClockSeconds = 365 * 24 * 60 * 60

// Limits of a scripted task (TaskSpec.script).
const (
	MaxScriptSteps      = 10000
	maxScriptStepMillis = 600000
	maxScriptOutput     = 60000
)

func (p *problems) repo(v string) {
	const field = "spec.repo"
	p.text(field, v, true, maxRepo, true)
	if v == "" || len(v) > maxRepo {
		return
	}
	switch {
	case strings.HasPrefix(v, "/"):
		return // absolute path
	case reScpLike.MatchString(v):
		return // git@host:owner/repo
	}
	// Checked on the text first, so that no error below quotes a token.
	if shown, bad := api.RepoCredential(v); bad {
		p.add(field, "%q: the URL's user info (before @) must be empty: give the forge credential to the node instead (its token is never part of a task's spec, which every client reads and events record)", truncate(shown, 80))
		return
	}
	u, err := url.Parse(v)
	if err != nil {
		if strings.Contains(v, "@") { // a password with a '/' in it may be cut where the check above looked
			p.add(field, "is neither an absolute path nor a URL (not quoted: it has an '@', and may hold a credential)")
			return
		}
		p.add(field, "%q is neither an absolute path nor a URL: %v", truncate(v, 80), err)
		return
	}
	switch u.Scheme {
	case "https", "http", "ssh", "git":
		if u.Host == "" {
			p.add(field, "%q has no host", truncate(v, 80))
		}
	case "file":
		if u.Path == "" {
			p.add(field, "%q has no path", truncate(v, 80))
		}
	default:
		p.add(field, "%q: scheme must be https, http, ssh, git or file, or give an absolute path", truncate(v, 80))
	}
}

func (p *problems) rev(field, v string) {
	p.text(field, v, true, maxRev, true)
	switch {
	case strings.HasPrefix(v, "-"):
		p.add(field, "%q must not start with '-'", truncate(v, 80))
	case strings.ContainsAny(v, " \t~^:?*[\\"):
		p.add(field, "%q is not a valid git revision", truncate(v, 80))
	}
}

func validateList(r *warrenv1.ListTasksRequest) error {
	var p problems
	if _, ok := warrenv1.TaskState_name[int32(r.GetState())]; !ok {
		p.add("state", "unknown state %d", r.GetState())
	}
	if n := r.GetPageSize(); n < 0 || n > maxPageSize {
		p.add("page_size", "must be 0..%d, got %d", maxPageSize, n)
	}
	if t := r.GetPageToken(); t != "" {
		p.taskID("page_token", t)
	}
	return p.err()
}

func validateAppend(r *warrenv1.AppendEventsRequest) error {
	var p problems
	p.taskID("task_id", r.GetTaskId())
	p.requestID(r.GetRequestId())
	switch n := len(r.GetEvents()); {
	case n == 0:
		p.add("events", "required: at least one event")
	case n > MaxEventsPerAppend:
		p.add("events", "%d events is over the limit of %d per append", n, MaxEventsPerAppend)
	}
	if len(r.GetEvents()) > MaxEventsPerAppend {
		return p.err() // (refused above: the rest is not worth checking)
	}
	for i, ev := range r.GetEvents() {
		p.addErr(checkEventInput(i, ev))
	}
	for _, sp := range appendShape(r.GetEvents()) {
		p.add(sp.field(), "%s", sp.issue)
	}
	return p.err()
}

// appendShape lists what the FSM refuses in an append whatever the task's
// state, at most one problem an event, in order: a state change to placed
// (a lease grant's), a state change after parked, and any event after one
// that ends the task (the last problem listed), and payload_part events
// that end the append (their event must follow them in it, so the log
// never holds parts without it). The API refuses them
// before anything is proposed; the FSM, when it reaches the event.
func appendShape(evs []*warrenv1.EventInput) []shapeProblem {
	var out []shapeProblem
	ended, parked := -1, false
	for i, ev := range evs {
		if ended >= 0 {
			return append(out, shapeProblem{i, "", fmt.Sprintf("follows events[%d], which ends the task: nothing may follow it", ended)})
		}
		switch ev.GetKind() {
		case KindPayloadPart:
			if i == len(evs)-1 {
				out = append(out, shapeProblem{i, "", "a payload_part must be followed, in the same append, by the event it is part of"})
			}
		case KindParked:
			parked = true
		case KindStateChanged:
			to := payloadState(ev.GetPayload())
			switch {
			case to == warrenv1.TaskState_TASK_STATE_PLACED:
				out = append(out, shapeProblem{i, ".payload.to", "placed is set by a lease grant, not appended"})
			case parked:
				out = append(out, shapeProblem{i, "", "a state change may not follow parked in the same append"})
			case Terminal(to):
				ended = i
			}
		}
	}
	return out
}

// shapeProblem is one of appendShape's: the event's index, the field
// within it ("" for the event) and what is wrong.
type shapeProblem struct {
	i          int
	sub, issue string
}

// field names the problem's field in the request.
func (sp shapeProblem) field() string { return fmt.Sprintf("events[%d]%s", sp.i, sp.sub) }

// validateAppendCommand checks an append command as validateAppend checks
// the request it is made from.
func validateAppendCommand(m *fsmv1.AppendEvents) error {
	return validateAppend(&warrenv1.AppendEventsRequest{TaskId: m.GetTaskId(), RequestId: m.GetRequestId(), Events: m.GetEvents()})
}

// validateForwarded checks a command a follower forwarded (client and
// operator writes only: batches, membership, plans, leases and a node's
// down are the leader's own) as the handler that made it checked its
// request: the cluster API is reachable by whoever reaches the API port,
// and the FSM trusts what it applies. What the handler adds itself (ids,
// times) is checked for its form.
func validateForwarded(cmd Command) error {
	if err := validateForwardedBody(cmd); err != nil {
		return err
	}
	return checkForwardedTime(cmd.Body)
}

func validateForwardedBody(cmd Command) error {
	switch m := cmd.Body.(type) {
	case *fsmv1.CreateTask:
		var p problems
		if !isTaskID(m.GetId()) {
			p.add("id", "%q is not a task id in canonical form (26 upper-case ULID characters)", truncate(m.GetId(), 40))
		}
		if m.GetTenant() == "" {
			p.add("tenant", "required")
		}
		p.addErr(validateCreate(&warrenv1.CreateTaskRequest{RequestId: m.GetRequestId(), Tenant: m.GetTenant(), Spec: m.GetSpec()}))
		return p.err()
	case *fsmv1.AppendEvents:
		return validateAppendCommand(m)
	case *fsmv1.SendMessage:
		return validateMessage(&warrenv1.SendMessageRequest{TaskId: m.GetTaskId(), Text: m.GetText(), RequestId: m.GetRequestId()})
	case *fsmv1.Decide:
		return validateDecide(&warrenv1.DecideRequest{TaskId: m.GetTaskId(), ToolCallId: m.GetToolCallId(), Comment: m.GetComment(), RequestId: m.GetRequestId()})
	case *fsmv1.CancelTask:
		return validateCancel(&warrenv1.CancelTaskRequest{TaskId: m.GetTaskId(), Reason: m.GetReason(), RequestId: m.GetRequestId()})
	case *fsmv1.RegisterNode:
		return validateNode(m.GetNode())
	case *fsmv1.NodeOp:
		var p problems
		p.nodeID("id", m.GetId())
		switch m.GetOp() {
		case fsmv1.NodeOp_OP_CORDON, fsmv1.NodeOp_OP_UNCORDON, fsmv1.NodeOp_OP_DRAIN, fsmv1.NodeOp_OP_REMOVE:
		default: // down is the leader's own verdict
			p.add("op", "%s is not an operator's op", m.GetOp())
		}
		return p.err()
	case *fsmv1.SetPool:
		return validatePool(m.GetTemplate(), m.GetTarget())
	}
	return fmt.Errorf("%s commands are not accepted from other servers", cmd.Type)
}

// checkForwardedTime checks the time a forwarded command carries (its
// handler set it from the clock): required, valid, and within the years
// 1 to 9999. An event's time outside them could not be written as JSON,
// and every SSE stream and watch -o json of its task would fail on it for
// good.
func checkForwardedTime(m proto.Message) error {
	tm, ok := m.(interface{ GetTime() *timestamppb.Timestamp })
	if !ok {
		return nil
	}
	ts := tm.GetTime()
	if ts == nil {
		return errors.New("time: required")
	}
	if err := ts.CheckValid(); err != nil { // the years 1 to 9999
		return fmt.Errorf("time: %v", err)
	}
	return nil
}

func validateMessage(r *warrenv1.SendMessageRequest) error {
	var p problems
	p.taskID("task_id", r.GetTaskId())
	p.requestID(r.GetRequestId())
	p.text("text", r.GetText(), true, maxMessage, false)
	// The message event's payload (the FSM's mustJSON) escapes quotes,
	// backslashes, control characters and <, > and &, some as six bytes:
	// 32 KiB of them would pass the event's limit.
	if len(r.GetText()) <= maxMessage {
		if n := len(mustJSON(map[string]string{"from": "user", "text": r.GetText()})); n > MaxPayloadBytes {
			p.add("text", "%d bytes as the event's JSON (quotes, backslashes, control characters and <, > and & are escaped), over the limit of %d", n, MaxPayloadBytes)
		}
	}
	return p.err()
}

func validateDecide(r *warrenv1.DecideRequest) error {
	var p problems
	p.taskID("task_id", r.GetTaskId())
	p.requestID(r.GetRequestId())
	p.text("tool_call_id", r.GetToolCallId(), true, maxRequestID, true)
	p.text("comment", r.GetComment(), false, maxComment, false)
	return p.err()
}

func validateCancel(r *warrenv1.CancelTaskRequest) error {
	var p problems
	p.taskID("task_id", r.GetTaskId())
	p.requestID(r.GetRequestId())
	p.text("reason", r.GetReason(), false, maxComment, false)
	return p.err()
}

// labels checks a label map: its size, keys and values.
func (p *problems) labels(field string, m map[string]string) {
	if n := len(m); n > maxLabels {
		p.add(field, "%d labels is over the limit of %d", n, maxLabels)
		return // the rest is not worth checking
	}
	for k, v := range m {
		if !reLabelKey.MatchString(k) {
			p.add(field, "key %q must be 1-63 of a-z, 0-9, '.', '/', '_', '-'", truncate(k, 80))
		}
		p.text(field+"["+truncate(k, 63)+"]", v, false, maxLabelValue, true)
	}
}

// unknownField finds a field m (named field) or a message it holds does
// not know, and returns where and its number.
func unknownField(m protoreflect.Message, field string) (string, protowire.Number, bool) {
	if u := m.GetUnknown(); len(u) > 0 {
		num, _, _ := protowire.ConsumeTag(u)
		return field, num, true
	}
	var at string
	var num protowire.Number
	found := false
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := field + "." + string(fd.Name())
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				at, num, found = unknownField(mv.Message(), name+"["+k.String()+"]")
				return !found
			})
		case fd.IsList():
			if fd.Message() == nil {
				return true
			}
			for i := range v.List().Len() {
				if at, num, found = unknownField(v.List().Get(i).Message(), fmt.Sprintf("%s[%d]", name, i)); found {
					break
				}
			}
		case fd.Message() != nil:
			at, num, found = unknownField(v.Message(), name)
		}
		return !found
	})
	return at, num, found
}

// scriptLinesAreObjects reports whether every line of a model script that
// is not blank or a comment is a JSON object, and if not, the first line
// that is not (counted from 1).
func scriptLinesAreObjects(script string) (int, bool) {
	for n, line := range strings.Split(script, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if line[0] != '{' || !json.Valid([]byte(line)) {
			return n + 1, false
		}
	}
	return 0, true
}
