package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/warrenhq/warren/agent/model"
	"github.com/warrenhq/warren/api"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/api/textcut"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/scheduler"
)

// clientFlags are the flags every client command takes.
type clientFlags struct {
	server  string
	output  string
	timeout time.Duration
	// noLimit makes --timeout 0 mean no deadline (sandbox exec) instead
	// of an error.
	noLimit bool
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	def := os.Getenv("WARREN_SERVER")
	if def == "" {
		def = client.DefaultServer
	}
	fs.StringVar(&c.server, "server", def, "server URL(s), comma-separated (env WARREN_SERVER)")
	fs.StringVar(&c.output, "o", "text", "output format: text or json")
	fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "deadline for one request")
}

// call makes one call of a service (svc: c.Tasks, c.Cluster) with the
// client's failover: on a server that is down, restarting or without a
// leader, the same request (its request id too) goes to the next server
// (client.Do).
func call[S, Req, Res any](ctx context.Context, c *client.Client, svc func() S,
	m func(S, context.Context, *connect.Request[Req]) (*connect.Response[Res], error), msg *Req) (*connect.Response[Res], error) {
	var resp *connect.Response[Res]
	err := c.DoEach(ctx, attemptBound(ctx, c.NumServers()), func(ctx context.Context) (err error) {
		resp, err = m(svc(), ctx, connect.NewRequest(msg))
		return err
	})
	return resp, err
}

// attemptBound is how long one attempt of a client command's call may
// take, given ctx (bounded by --timeout) and n servers: with several, an
// equal share of the time left, but at least minAttempt (or all of it,
// if less is left), so a server that takes the connection and never
// answers leaves time for the next; with one, no bound but ctx's.
func attemptBound(ctx context.Context, n int) time.Duration {
	deadline, ok := ctx.Deadline()
	if !ok || n <= 1 {
		return 0
	}
	left := time.Until(deadline)
	return min(left, max(left/time.Duration(n), minAttempt))
}

// minAttempt is the least time attemptBound gives an attempt.
const minAttempt = 3 * time.Second

func (c *clientFlags) dial() (*client.Client, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	return client.New(c.server)
}

// check refuses, naming the flag, values that would make every call fail
// with a message that does not say why (a bare deadline_exceeded, an
// unavailable server).
func (c *clientFlags) check() error {
	var errs []error
	if c.output != "text" && c.output != "json" {
		errs = append(errs, fmt.Errorf("-o: %q is not text or json", c.output))
	}
	switch {
	case c.timeout < 0 && c.noLimit:
		errs = append(errs, fmt.Errorf("--timeout %v: must not be negative (0: no limit)", c.timeout))
	case c.timeout <= 0 && !c.noLimit:
		errs = append(errs, fmt.Errorf("--timeout %v: must be positive", c.timeout))
	}
	for _, s := range strings.Split(c.server, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if err := checkServerURL(s); err != nil {
			errs = append(errs, fmt.Errorf("--server %q: %w", s, err))
		}
	}
	return errors.Join(errs...)
}

// checkServerURL checks one --server URL: http or https, a host, and a
// port from 1 to 65535 if one is given.
func checkServerURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("not a URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return errors.New("must start with http:// or https://")
	}
	if u.Hostname() == "" {
		return errors.New("no host")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %s is not 1-65535", p)
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return errors.New("empty port")
	}
	return nil
}

// start parses a client command's flags and positional arguments (named
// by names), dials the server and returns a context bounded by --timeout.
func (c *clientFlags) start(fs *flag.FlagSet, args []string, names ...string) ([]string, *client.Client, context.Context, context.CancelFunc, error) {
	pos, err := parse(fs, args)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if err := wantArgs(fs, pos, names...); err != nil {
		return nil, nil, nil, nil, err
	}
	cl, err := c.dial()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	return pos, cl, ctx, cancel, nil
}

// pj prints every scalar field, false and 0 too, and empty lists and maps
// (scripts read `.eligible`, `.task_count`); an unset message field is
// left out rather than printed as null.
var pj = protojson.MarshalOptions{UseProtoNames: true, EmitDefaultValues: true}

func printJSON(w io.Writer, m proto.Message) error {
	b, err := pj.Marshal(m)
	if err != nil {
		return err
	}
	var v any // re-indent compactly onto one line, stable across protojson versions
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	b, _ = json.Marshal(v)
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func newRequestID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "cli-" + hex.EncodeToString(b)
}

// requestIDFlag registers --request-id, the write's idempotency key.
func requestIDFlag(fs *flag.FlagSet) *string {
	return fs.String("request-id", "", "idempotency key: a write run again with the same one is applied once (default: random)")
}

// orNewRequestID is id, or a new random one if it is empty.
func orNewRequestID(id string) string {
	if id == "" {
		return newRequestID()
	}
	return id
}

// unsureWrite adds to err, the error of a write sent with request id
// reqID, what to do when the cluster may have applied it all the same
// (the answer was lost, or came too late): run it again with that id,
// which applies it at most once. Run again without it, a lost create
// made a second task, a lost steer a second message.
func unsureWrite(err error, reqID string) error {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeCanceled, connect.CodeUnknown:
		return fmt.Errorf("%w (it may have been applied: run the command again with --request-id %s to apply it at most once)", err, reqID)
	}
	return err
}

func cmdTask(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	verb, args := args[0], args[1:]
	switch verb {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	case "create":
		return taskCreate(args, stdout, stderr)
	case "get":
		return taskGet(args, stdout)
	case "list", "ls":
		return taskList(args, stdout)
	case "watch":
		return taskWatch(args, stdout, stderr)
	case "steer":
		return taskSteer(args, stdout)
	case "approve", "reject":
		return taskDecide(verb, args, stdout)
	case "cancel":
		return taskCancel(args, stdout)
	}
	return fmt.Errorf("task: unknown verb %q (create, get, list, watch, steer, approve, reject, cancel)", verb)
}

func taskCreate(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("task create", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	spec := &warrenv1.TaskSpec{Budgets: &warrenv1.Budgets{}}
	res := func() *warrenv1.Resources {
		if spec.Resources == nil {
			spec.Resources = &warrenv1.Resources{}
		}
		return spec.Resources
	}
	fs.StringVar(&spec.Repo, "repo", "", "repository URL or absolute path (required)")
	fs.StringVar(&spec.Base, "base", "", "base revision (required)")
	fs.StringVar(&spec.IssueTitle, "title", "", "issue title (required)")
	fs.StringVar(&spec.IssueBody, "body", "", "issue body")
	bodyFile := fs.String("body-file", "", "read the issue body from this file (- for stdin)")
	fs.StringVar(&spec.Model, "model", "", "model name (claude* goes to Anthropic, others to the OpenAI-compatible server; with neither it nor --model-script nor --script-steps, the task runs three placeholder steps and calls no model)")
	fs.StringVar(&spec.Template, "template", "", "sandbox template")
	fs.StringVar(&spec.TestCommand, "test-command", "", "the repository's test command")
	fs.Int64Var(&spec.Budgets.MaxSteps, "max-steps", 0, "step budget (0: none)")
	fs.Int64Var(&spec.Budgets.MaxTokens, "max-tokens", 0, "token budget (0: none)")
	fs.Int64Var(&spec.Budgets.MaxWallClockSeconds, "max-wall-clock", 0, "wall-clock budget in seconds (0: none)")
	fs.Func("max-cost", "cost budget in US dollars, e.g. 2.50 (0: none; the node's --model-prices price each call)", func(v string) error {
		usd, err := strconv.ParseFloat(v, 64)
		if err != nil || usd < 0 || usd > 1e6 || math.IsNaN(usd) {
			return fmt.Errorf("%q is not an amount of dollars from 0 to 1000000", v)
		}
		spec.Budgets.MaxCostMicroUsd = int64(math.Round(usd * 1e6))
		return nil
	})
	egress := fs.String("egress", "", "comma-separated egress allow-list (host or *.suffix); with the registries profile they add to the package registries")
	policyFile := fs.String("policy", "", `a JSON file of policy rules for the agent's tool calls, checked before the defaults: [{"tool":"run_command","command":"\\bcurl\\b","tier":"deny","reason":"no downloads"}, ...]`)
	modelScript := fs.String("model-script", "", "a JSONL file of assistant turns: run the agent loop on the scripted provider (no model is called)")
	fs.StringVar(&spec.EgressProfile, "egress-profile", "", "egress profile of the task's sandbox: registries (default), custom (--egress only) or none")
	fs.StringVar(&spec.Driver, "driver", "", "sandbox driver: microvm (default), container or sim (simulated)")
	fs.Func("cpu", "CPU cores the task's sandbox needs, e.g. 2 or 0.5 (default: the server's, 1); placement reserves them, and the sandbox gets them rounded up to whole vCPUs", func(v string) error {
		c, err := strconv.ParseFloat(v, 64)
		// !(c >= 0.001) also refuses NaN, and what would round to 0m.
		if err != nil || !(c >= 0.001) || c > scheduler.MaxTaskMilliCPU/1000 {
			return fmt.Errorf("%q is not a number of cores from 0.001 to %d", v, scheduler.MaxTaskMilliCPU/1000)
		}
		res().MilliCpu = int64(math.Round(c * 1000))
		return nil
	})
	fs.Func("memory", "memory the task's sandbox needs, e.g. 2GiB or 512MiB (default: the server's placement reserve, 512 MiB, and the driver's sandbox size); from 128MiB to 64GiB", func(v string) error {
		b, err := parseSize(v)
		if err != nil {
			return err
		}
		if b < scheduler.MinTaskMemoryBytes || b > scheduler.MaxTaskMemoryBytes {
			return fmt.Errorf("%s is not from 128MiB to 64GiB", v)
		}
		res().MemoryBytes = b
		return nil
	})
	script := &warrenv1.Script{}
	scripted := false
	fs.Func("script-steps", "run N scripted steps instead of the agent loop (no model is called)", func(v string) error {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return fmt.Errorf("not a number of steps: %q", v)
		}
		script.Steps, scripted = uint32(n), true
		return nil
	})
	stepMillis := fs.Uint("script-step-millis", 200, "how long each scripted step's command runs (ms)")
	scriptOutput := fs.Uint("script-output-bytes", 0, "size of each scripted step's output")
	labels := fs.String("labels", "", "comma-separated k=v labels")
	selector := fs.String("node-selector", "", "comma-separated k=v labels the task's node must carry (see: warren node --labels)")
	tenant := fs.String("tenant", "", "tenant (default: default)")
	reqID := requestIDFlag(fs)
	quiet := fs.Bool("q", false, "print only the new task's id")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos); err != nil {
		return err
	}
	if *bodyFile != "" {
		if spec.IssueBody != "" {
			return fmt.Errorf("body and body-file: give one")
		}
		var b []byte
		if *bodyFile == "-" {
			b, err = io.ReadAll(os.Stdin)
		} else {
			b, err = os.ReadFile(*bodyFile)
		}
		if err != nil {
			return fmt.Errorf("body-file: %w", err)
		}
		if !utf8.Valid(b) {
			return fmt.Errorf("body-file %s: not UTF-8 text", *bodyFile)
		}
		spec.IssueBody = string(b)
	}
	if err := fitUint32(map[string]uint{"script-step-millis": *stepMillis, "script-output-bytes": *scriptOutput}); err != nil {
		return err
	}
	// --script-steps given at all makes a scripted task, which the server
	// checks (0 steps is refused, naming spec.script.steps); it used to be
	// dropped, and the task ran the agent loop instead.
	if scripted {
		script.StepMillis, script.OutputBytes = uint32(*stepMillis), uint32(*scriptOutput)
		spec.Script = script
	} else if set := flagsSet(fs, "script-step-millis", "script-output-bytes"); len(set) > 0 {
		return fmt.Errorf("%s: only with --script-steps", strings.Join(set, ", "))
	}
	if *egress != "" {
		spec.EgressAllow = strings.Split(*egress, ",")
	}
	if *policyFile != "" {
		if spec.Policy, err = readPolicy(*policyFile); err != nil {
			return err
		}
	}
	if *modelScript != "" {
		b, err := os.ReadFile(*modelScript)
		if err != nil {
			return fmt.Errorf("model-script: %w", err)
		}
		// Checked here in full, naming the line: the servers check only
		// that each line is a JSON object, and the node the rest, once the
		// task has a sandbox.
		if _, err := model.ParseScripted(*modelScript, b); err != nil {
			return fmt.Errorf("model-script: %w", err)
		}
		spec.ModelScript = string(b)
		if spec.Model == "" {
			spec.Model = "scripted"
		}
	}
	if spec.Labels, err = parseKV("labels", *labels); err != nil {
		return err
	}
	if spec.NodeSelector, err = parseKV("node-selector", *selector); err != nil {
		return err
	}
	*reqID = orNewRequestID(*reqID)
	c, err := cf.dial()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
	defer cancel()
	resp, err := call(ctx, c, c.Tasks, warrenv1connect.TaskServiceClient.CreateTask, &warrenv1.CreateTaskRequest{RequestId: *reqID, Tenant: *tenant, Spec: spec})
	if err != nil {
		return unsureWrite(err, *reqID)
	}
	warnNoNode(ctx, c, spec.GetDriver(), stderr)
	if *quiet {
		_, err = fmt.Fprintln(stdout, resp.Msg.GetTask().GetId())
		return err
	}
	return printTask(stdout, cf.output, resp.Msg.GetTask())
}

// resourcesText is a task's resources as task create's flags take them;
// a field left zero is the server's default.
func resourcesText(r *warrenv1.Resources) string {
	cpu, mem := "default", "default"
	if m := r.GetMilliCpu(); m > 0 {
		cpu = strconv.FormatFloat(float64(m)/1000, 'f', -1, 64)
	}
	if b := r.GetMemoryBytes(); b > 0 {
		mem = strconv.FormatFloat(float64(b)/(1<<20), 'f', -1, 64) + "MiB"
	}
	return "cpu " + cpu + ", memory " + mem
}

func printTask(w io.Writer, output string, t *warrenv1.Task) error {
	if output == "json" {
		return printJSON(w, t)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%s\n", t.GetId())
	fmt.Fprintf(tw, "state\t%s\n", scheduler.StateName(t.GetState()))
	fmt.Fprintf(tw, "title\t%s\n", t.GetSpec().GetIssueTitle())
	fmt.Fprintf(tw, "repo\t%s @ %s\n", t.GetSpec().GetRepo(), t.GetSpec().GetBase())
	fmt.Fprintf(tw, "tenant\t%s\n", t.GetTenant())
	fmt.Fprintf(tw, "events\t%d\n", t.GetNextSeq()-1)
	if r := t.GetSpec().GetResources(); r.GetMilliCpu() > 0 || r.GetMemoryBytes() > 0 {
		fmt.Fprintf(tw, "resources\t%s\n", resourcesText(r))
	}
	if l := t.GetLease(); l.GetNode() != "" {
		fmt.Fprintf(tw, "lease\t%s (epoch %d)\n", l.GetNode(), l.GetEpoch())
	}
	if len(t.GetPendingApprovals()) > 0 {
		fmt.Fprintf(tw, "pending approvals\t%s\n", strings.Join(t.GetPendingApprovals(), ", "))
	}
	if t.GetParked() {
		fmt.Fprintf(tw, "parked\tyes: no sandbox is held until the approvals are decided\n")
	}
	if u := t.GetUsage(); u.GetModelCalls() > 0 {
		fmt.Fprintf(tw, "usage\t%d model calls; tokens in %d, cache write %d, cache read %d, out %d; cache hit %.0f%%; $%.4f\n",
			u.GetModelCalls(), u.GetInputTokens(), u.GetCacheWriteTokens(), u.GetCacheReadTokens(), u.GetOutputTokens(),
			100*u.GetCacheHitRate(), float64(u.GetCostMicroUsd())/1e6)
	}
	fmt.Fprintf(tw, "created\t%s\n", t.GetCreatedAt().AsTime().Format(time.RFC3339))
	return tw.Flush()
}

func taskGet(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("task get", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	pos, c, ctx, cancel, err := cf.start(fs, args, "ID")
	if err != nil {
		return err
	}
	defer cancel()
	resp, err := call(ctx, c, c.Tasks, warrenv1connect.TaskServiceClient.GetTask, &warrenv1.GetTaskRequest{Id: pos[0]})
	if err != nil {
		return err
	}
	return printTask(stdout, cf.output, resp.Msg.GetTask())
}

func taskList(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("task list", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	stateName := fs.String("state", "", "only tasks in this state: "+strings.Join(stateNames(), ", "))
	limit := fs.Int("limit", 0, "stop after this many tasks (0: all)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos); err != nil {
		return err
	}
	if *limit < 0 {
		return fmt.Errorf("limit: %d must not be negative (0: all)", *limit)
	}
	var state warrenv1.TaskState
	if *stateName != "" {
		var ok bool
		if state, ok = scheduler.ParseState(*stateName); !ok {
			return fmt.Errorf("state: %q is not one of %s", *stateName, strings.Join(stateNames(), ", "))
		}
	}
	c, err := cf.dial()
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	if cf.output == "text" {
		fmt.Fprintln(tw, "ID\tSTATE\tEVENTS\tCREATED\tTITLE")
	}
	token, n := "", 0
	for {
		ctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
		resp, err := call(ctx, c, c.Tasks, warrenv1connect.TaskServiceClient.ListTasks, &warrenv1.ListTasksRequest{State: state, PageSize: 500, PageToken: token})
		cancel()
		if err != nil {
			return err
		}
		for _, t := range resp.Msg.GetTasks() {
			if *limit > 0 && n >= *limit {
				return tw.Flush()
			}
			n++
			if cf.output == "json" {
				if err := printJSON(stdout, t); err != nil {
					return err
				}
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", t.GetId(), scheduler.StateName(t.GetState()), t.GetNextSeq()-1,
				t.GetCreatedAt().AsTime().Format(time.RFC3339), t.GetSpec().GetIssueTitle())
		}
		if token = resp.Msg.GetNextPageToken(); token == "" {
			return tw.Flush()
		}
	}
}

func stateNames() []string {
	return []string{"pending", "placed", "running", "waiting_approval", "succeeded", "failed", "cancelled"}
}

func taskWatch(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("task watch", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	after := fs.Uint64("after", 0, "print events with seq greater than this")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, "ID"); err != nil {
		return err
	}
	c, err := cf.dial()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	state := "" // the task's state after the last state_changed watched
	// The text output shows an event too large for one (payload_part
	// events, then the event) as the event, joined; JSON shows each as
	// the log holds it.
	var parts api.PartJoiner
	err = c.WatchWith(ctx, pos[0], *after, func(ev *warrenv1.Event) error {
		if cf.output != "json" {
			var ok bool
			if ev, ok = joinParts(&parts, ev); !ok {
				return nil
			}
		}
		if ev.GetKind() == "state_changed" {
			var p struct {
				To string `json:"to"`
			}
			if json.Unmarshal(ev.GetPayload(), &p) == nil && p.To != "" {
				state = p.To
			}
		}
		return printEvent(stdout, cf.output, ev)
	}, client.WatchOptions{
		OnRetry: func(err error) {
			fmt.Fprintf(stderr, "warren: stream interrupted (%v); reconnecting to %s\n", err, c.URL())
		},
		// --timeout bounds how long it keeps reconnecting without a
		// server that streams (not how long it watches).
		GiveUpAfter: cf.timeout,
	})
	if err != nil {
		return err
	}
	if state == "" { // --after was past the last state change: ask
		ctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
		defer cancel()
		resp, err := call(ctx, c, c.Tasks, warrenv1connect.TaskServiceClient.GetTask, &warrenv1.GetTaskRequest{Id: pos[0]})
		if err != nil {
			return err
		}
		state = scheduler.StateName(resp.Msg.GetTask().GetState())
	}
	return watchEnded(stderr, pos[0], state)
}

// watchEnded is how `warren task watch` ends for a task that ended in
// state: nil (exit status 0) for succeeded, exit status 1 for failed and
// 2 for cancelled, with a line on stderr, so that scripts can run
// `warren task watch "$ID" && next-step`.
func watchEnded(stderr io.Writer, id, state string) error {
	var code exitCode
	switch state {
	case "failed":
		code = 1
	case "cancelled":
		code = 2
	default:
		return nil
	}
	fmt.Fprintf(stderr, "warren: task %s ended %s\n", id, state)
	return code
}

// joinParts gives ev back with the fields its payload_part events held
// put back into its payload, or false for a payload_part (held until its
// event). Parts that do not make up their event (a watch that began among
// them) leave the event as it is.
func joinParts(j *api.PartJoiner, ev *warrenv1.Event) (*warrenv1.Event, bool) {
	p, ok, err := j.Add(ev.GetKind(), ev.GetPayload())
	if !ok {
		return nil, false
	}
	if err != nil {
		return ev, true
	}
	return &warrenv1.Event{TaskId: ev.GetTaskId(), Seq: ev.GetSeq(), Time: ev.GetTime(), Kind: ev.GetKind(),
		Epoch: ev.GetEpoch(), RequestId: ev.GetRequestId(), Payload: p}, true
}

func printEvent(w io.Writer, output string, ev *warrenv1.Event) error {
	if output == "json" {
		b, err := api.MarshalEvent(ev)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	// Every part of the summary comes from the task (the model, tools,
	// the repository): one line, with no control characters that would
	// reach the terminal raw.
	p := oneLine(eventSummary(ev.GetKind(), ev.GetPayload()))
	p = textcut.Ellipsis(p, 200)
	_, err := fmt.Fprintf(w, "%5d  %s  %-18s %s\n", ev.GetSeq(), ev.GetTime().AsTime().Format("15:04:05.000"), oneLine(ev.GetKind()), p)
	return err
}

// oneLine makes s one line of text for a terminal: each run of white
// space and control characters (newlines, ESC, BEL, ...) becomes one
// space, invalid UTF-8 becomes U+FFFD, and the ends are trimmed.
func oneLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
	return strings.Join(strings.Fields(s), " ")
}

// termSafe makes s safe to print to a terminal, keeping its shape (unlike
// oneLine): each control character (ESC, BEL, CR, ...; newlines and tabs
// too unless lines) becomes '?', as ls(1) shows them, and invalid UTF-8
// becomes U+FFFD. For text a sandbox or a model chose: a file's name, a
// guest's error, which could otherwise move the cursor, retitle the
// window or rewrite what was printed before.
func termSafe(s string, lines bool) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) && !(lines && (r == '\n' || r == '\t')) {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}

// rawPayload is a payload shown as it is: JSON compacted onto one line.
func rawPayload(payload []byte) string {
	var b bytes.Buffer
	if json.Compact(&b, payload) == nil {
		return b.String()
	}
	return string(payload)
}

// eventSummary is about an event for people: the agent's events say what
// happened; others show their payload. printEvent makes it one line.
func eventSummary(kind string, payload []byte) string {
	var p struct {
		Step     int64           `json:"step"`
		Tool     string          `json:"tool"`
		Input    json.RawMessage `json:"input"`
		Output   string          `json:"output"`
		IsError  bool            `json:"is_error"`
		Text     string          `json:"text"`
		From     string          `json:"from"`
		To       string          `json:"to"`
		Reason   string          `json:"reason"`
		Command  string          `json:"command"`
		Passed   *bool           `json:"passed"`
		ExitCode int             `json:"exit_code"`
		Files    int             `json:"files"`
		Added    int             `json:"added"`
		Deleted  int             `json:"deleted"`
		Findings []struct {
			Kind, Action, Path string
		} `json:"findings"`
		Blocked  bool   `json:"blocked"`
		NeedsApp bool   `json:"needs_approval"`
		Head     string `json:"head"`
		Commit   string `json:"commit"`
		Forge    string `json:"forge"`
		Response struct {
			Content []struct {
				Type, Text, Name string
				Input            json.RawMessage
			} `json:"content"`
		} `json:"response"`
		CostMicroUSD int64   `json:"cost_micro_usd"`
		CacheHit     float64 `json:"cache_hit_rate"`
	}
	if json.Unmarshal(payload, &p) != nil {
		return rawPayload(payload)
	}
	switch kind {
	case "model_call":
		var parts []string
		for _, b := range p.Response.Content {
			switch b.Type {
			case "text":
				parts = append(parts, b.Text)
			case "tool_use":
				parts = append(parts, "→ "+b.Name+" "+string(b.Input))
			}
		}
		return fmt.Sprintf("step %d: %s (cache hit %.0f%%, $%.4f)", p.Step, strings.Join(parts, " "), 100*p.CacheHit, float64(p.CostMicroUSD)/1e6)
	case "tool_call":
		return p.Tool + " " + string(p.Input)
	case "tool_result":
		s := p.Output
		if p.IsError {
			s = "error: " + s
		}
		return s
	case "message":
		if p.From == "user" {
			return "user: " + p.Text
		}
		return p.Text
	case "state_changed":
		s := p.To
		if p.From != "" {
			s = p.From + " → " + p.To
		}
		if p.Reason != "" {
			s += ": " + p.Reason
		}
		return s
	case "test_run":
		verdict := "failed"
		if p.Passed != nil && *p.Passed {
			verdict = "passed"
		}
		return fmt.Sprintf("%s %s (exit %d)", p.Command, verdict, p.ExitCode)
	case "diff_checked":
		var fs []string
		for _, f := range p.Findings {
			fs = append(fs, fmt.Sprintf("%s %s (%s)", f.Kind, f.Path, f.Action))
		}
		if len(fs) == 0 {
			fs = []string{"no findings"}
		}
		return fmt.Sprintf("%d files +%d -%d: %s", p.Files, p.Added, p.Deleted, strings.Join(fs, ", "))
	case "pull_request":
		var pr struct {
			PR *struct {
				URL     string `json:"url"`
				Created bool   `json:"created"`
			} `json:"pull_request"`
		}
		_ = json.Unmarshal(payload, &pr)
		s := fmt.Sprintf("%s pushed at %.12s (forge %s)", p.Head, p.Commit, p.Forge)
		if pr.PR != nil {
			s += " " + pr.PR.URL
		}
		return s
	}
	return rawPayload(payload)
}

func taskSteer(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("task steer", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	reqID := requestIDFlag(fs)
	pos, c, ctx, cancel, err := cf.start(fs, args, "ID", "TEXT")
	if err != nil {
		return err
	}
	defer cancel()
	id := orNewRequestID(*reqID)
	resp, err := call(ctx, c, c.Tasks, warrenv1connect.TaskServiceClient.SendMessage, &warrenv1.SendMessageRequest{TaskId: pos[0], Text: pos[1], RequestId: id})
	if err != nil {
		return unsureWrite(err, id)
	}
	if cf.output == "json" {
		return printJSON(stdout, resp.Msg)
	}
	_, err = fmt.Fprintf(stdout, "message recorded as event %d\n", resp.Msg.GetSeq())
	return err
}

func taskDecide(verb string, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("task "+verb, flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	comment := fs.String("comment", "", "a note for the record")
	reqID := requestIDFlag(fs)
	pos, c, ctx, cancel, err := cf.start(fs, args, "ID", "TOOL_CALL_ID")
	if err != nil {
		return err
	}
	defer cancel()
	req := &warrenv1.DecideRequest{TaskId: pos[0], ToolCallId: pos[1], Comment: *comment, RequestId: orNewRequestID(*reqID)}
	decide := warrenv1connect.TaskServiceClient.Approve
	if verb != "approve" {
		decide = warrenv1connect.TaskServiceClient.Reject
	}
	resp, err := call(ctx, c, c.Tasks, decide, req)
	if err != nil {
		return unsureWrite(err, req.GetRequestId())
	}
	if cf.output == "json" {
		return printJSON(stdout, resp.Msg)
	}
	_, err = fmt.Fprintf(stdout, "decision recorded as event %d\n", resp.Msg.GetSeq())
	return err
}

func taskCancel(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("task cancel", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	reason := fs.String("reason", "", "why, for the record")
	reqID := requestIDFlag(fs)
	pos, c, ctx, cancel, err := cf.start(fs, args, "ID")
	if err != nil {
		return err
	}
	defer cancel()
	id := orNewRequestID(*reqID)
	resp, err := call(ctx, c, c.Tasks, warrenv1connect.TaskServiceClient.CancelTask, &warrenv1.CancelTaskRequest{TaskId: pos[0], Reason: *reason, RequestId: id})
	if err != nil {
		return unsureWrite(err, id)
	}
	return printTask(stdout, cf.output, resp.Msg.GetTask())
}

// parseKV parses "k=v,k=v" for the flag named name; "" is nil. Spaces
// around an item are dropped; an empty key, or a key given twice (which
// kept only the last value), is an error naming the flag.
func parseKV(name, s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range splitComma(s) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s: %q is not k=v", name, kv)
		}
		if prev, dup := out[k]; dup {
			return nil, fmt.Errorf("%s: key %q given twice (%s=%s and %s=%s)", name, k, k, prev, k, v)
		}
		out[k] = v
	}
	return out, nil
}

// readPolicy reads a JSON array of policy rules (the servers check them).
func readPolicy(path string) ([]*warrenv1.PolicyRule, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	var rules []*warrenv1.PolicyRule
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("policy: %s: want a JSON array of rules: %v", path, err)
	}
	for i, r := range raw {
		rule := &warrenv1.PolicyRule{}
		if err := protojson.Unmarshal(r, rule); err != nil {
			return nil, fmt.Errorf("policy: %s: rule %d: %v", path, i, err)
		}
		rules = append(rules, rule)
	}
	return rules, nil
}

// flagsSet returns which of names were given on the command line.
func flagsSet(fs *flag.FlagSet, names ...string) []string {
	var set []string
	fs.Visit(func(f *flag.Flag) {
		if slices.Contains(names, f.Name) {
			set = append(set, "--"+f.Name)
		}
	})
	return set
}

// warnNoNode says so on stderr when no ready, eligible node runs the new
// task's driver: it stays pending until one does. (A task without a driver
// needs microvm, and warren dev's node runs sim unless told otherwise.) A
// failed look is not the create's failure: nothing is said.
func warnNoNode(ctx context.Context, c *client.Client, driver string, stderr io.Writer) {
	if driver == "" {
		driver = scheduler.DefaultDriver
	}
	resp, err := call(ctx, c, c.Cluster, warrenv1connect.ClusterServiceClient.ListNodes, &warrenv1.ListNodesRequest{})
	if err != nil {
		return
	}
	for _, n := range resp.Msg.GetNodes() {
		if n.GetStatus() == warrenv1.NodeStatus_NODE_STATUS_READY && n.GetEligible() && slices.Contains(n.GetDrivers(), driver) {
			return
		}
	}
	fmt.Fprintf(stderr, "warning: no ready node runs the %s driver, so the task stays pending until one does (give --driver to pick another)\n", driver)
}
