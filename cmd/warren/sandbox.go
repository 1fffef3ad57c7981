package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/internal/atomicfile"
	"github.com/warrenhq/warren/noded"
)

const sandboxUsage = `usage: warren sandbox <command>

  create [--template T] [--vcpus N] [--memory-mb N] [--pids N] [--disk-mb N] [--ttl DUR] [--env K=V,...] [--node ID] [-q]
         [--egress-profile registries|custom|none] [--egress-allow NAMES] [--egress-prefix CIDRS]
                             make a sandbox; prints it (-o json: its id is .id; -q: only the id)
  egress ID [--egress-profile P] [--egress-allow NAMES] [--egress-prefix CIDRS]
                             change a live sandbox's egress policy (new connections follow it)
  exec ID [--env K=V,...] [--dir D] [--cmd-timeout DUR] [--stdin] -- CMD...
                             run a command, streaming its output; exits with its exit code
                             (its own failures: 127 not found, 126 could not run, 125 any other)
  cp SRC DST                 copy one file: LOCAL ID:/PATH or ID:/PATH LOCAL ("-" is stdin/stdout)
  files ID PATH              list a directory in the sandbox
  get ID                     show one sandbox
  pause ID | resume ID       save a sandbox to disk and stop it | bring it back
  rm ID...                   destroy sandboxes; prints each id removed
  ls [--node ID]             list sandboxes (a task's sandboxes too, with its TASK: warren task cancel ends those)

warren pool set TEMPLATE N [--node ID]   keep N warm sandboxes of TEMPLATE on each node (--node: until its next session)
warren pool list [--node ID]             show the warm pools
`

// exitCode makes the process exit with a command's exit code, 1..255
// (see exitStatus for any other).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func cmdSandbox(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, sandboxUsage)
		return errUsage
	}
	verb, args := args[0], args[1:]
	fs := flag.NewFlagSet("sandbox "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	switch verb {
	case "create":
		setDefault(fs, "timeout", "5m")
		template := fs.String("template", "", "template name (default: the node's default)")
		vcpus := fs.Uint("vcpus", 0, "vCPUs (0: the default, 1)")
		mem := fs.Uint("memory-mb", 0, "memory in MiB (0: the default, 256)")
		pids := fs.Uint("pids", 0, "processes inside the sandbox (0: the default, 4096)")
		disk := fs.Uint("disk-mb", 0, "disk in MiB (0: the template's)")
		ttl := fs.Duration("ttl", 0, "wall-clock life; the node destroys it then (0: the node's default, 1h)")
		var env envFlag
		fs.Var(&env, "env", "environment of every command, K=V (repeat it, or K=V,K2=V2)")
		node := fs.String("node", "", "put it on this node")
		quiet := fs.Bool("q", false, "print only the id")
		var ef egressPolicyFlags
		ef.register(fs)
		_, c, ctx, cancel, err := cf.start(fs, args)
		if err != nil {
			return err
		}
		defer cancel()
		if *ttl < 0 {
			return fmt.Errorf("ttl %v: must not be negative", *ttl)
		}
		if err := fitUint32(map[string]uint{"vcpus": *vcpus, "memory-mb": *mem, "pids": *pids, "disk-mb": *disk}); err != nil {
			return err
		}
		envm, err := parseEnv(env...)
		if err != nil {
			return err
		}
		res, err := c.Sandboxes().CreateSandbox(ctx, connect.NewRequest(&warrenv1.CreateSandboxRequest{
			// A TTL under 1s must not become 0, the node's default (an hour).
			Template: *template, TtlSeconds: ceilSeconds(*ttl), Env: envm, NodeId: *node,
			Limits: &warrenv1.SandboxLimits{Vcpus: uint32(*vcpus), MemoryMb: uint32(*mem), Pids: uint32(*pids), DiskMb: uint32(*disk)},
			Egress: ef.policy(fs),
		}))
		if err != nil {
			return err
		}
		if *quiet {
			_, err := fmt.Fprintln(stdout, res.Msg.GetSandbox().GetId())
			return err
		}
		return printSandboxes(stdout, cf.output, res.Msg.GetSandbox())
	case "egress":
		var ef egressPolicyFlags
		ef.register(fs)
		pos, c, ctx, cancel, err := cf.start(fs, args, "ID")
		if err != nil {
			return err
		}
		defer cancel()
		p := ef.policy(fs)
		if p == nil {
			return errors.New("sandbox egress: give --egress-profile, --egress-allow or --egress-prefix")
		}
		res, err := call(ctx, c, c.Sandboxes, warrenv1connect.SandboxServiceClient.SetEgress, &warrenv1.SetEgressRequest{SandboxId: pos[0], Egress: p})
		if err != nil {
			return err
		}
		if cf.output == "json" {
			return printJSON(stdout, res.Msg.GetSandbox())
		}
		_, err = fmt.Fprintf(stdout, "%s: egress %s\n", pos[0], describeEgress(res.Msg.GetSandbox().GetEgress()))
		return err
	case "get":
		pos, c, ctx, cancel, err := cf.start(fs, args, "ID")
		if err != nil {
			return err
		}
		defer cancel()
		res, err := call(ctx, c, c.Sandboxes, warrenv1connect.SandboxServiceClient.GetSandbox, &warrenv1.GetSandboxRequest{SandboxId: pos[0]})
		if err != nil {
			return err
		}
		return printSandboxes(stdout, cf.output, res.Msg.GetSandbox())
	case "ls", "list":
		node := fs.String("node", "", "only this node's")
		_, c, ctx, cancel, err := cf.start(fs, args)
		if err != nil {
			return err
		}
		defer cancel()
		res, err := call(ctx, c, c.Sandboxes, warrenv1connect.SandboxServiceClient.ListSandboxes, &warrenv1.ListSandboxesRequest{NodeId: *node})
		if err != nil {
			return err
		}
		warnNodes(stderr, res.Msg.GetUnreachableNodes(), res.Msg.GetRefusedNodes(), "; its sandboxes are missing")
		if cf.output != "json" && slices.ContainsFunc(res.Msg.GetSandboxes(), func(sb *warrenv1.Sandbox) bool { return sb.GetTaskId() != "" }) {
			fmt.Fprintln(stderr, "note: a sandbox with a TASK is its task's: the sandbox commands refuse it; `warren task cancel TASK` ends it")
		}
		return printSandboxes(stdout, cf.output, res.Msg.GetSandboxes()...)
	case "rm", "delete":
		pos, err := parse(fs, args)
		if err != nil {
			return err
		}
		if len(pos) == 0 {
			return errors.New("sandbox rm: want at least one ID")
		}
		c, err := cf.dial()
		if err != nil {
			return err
		}
		var errs []error
		for _, id := range pos {
			ctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
			err := deleteSandbox(ctx, c, id)
			cancel()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", id, err))
				continue
			}
			fmt.Fprintln(stdout, id) // with -o json too: scripts read these ids
		}
		return errors.Join(errs...)
	case "pause", "resume":
		setDefault(fs, "timeout", "5m")
		pos, c, ctx, cancel, err := cf.start(fs, args, "ID")
		if err != nil {
			return err
		}
		defer cancel()
		var sb *warrenv1.Sandbox
		if verb == "pause" {
			res, err := c.Sandboxes().Pause(ctx, connect.NewRequest(&warrenv1.PauseRequest{SandboxId: pos[0]}))
			if err != nil {
				return err
			}
			sb = res.Msg.GetSandbox()
		} else {
			res, err := c.Sandboxes().Resume(ctx, connect.NewRequest(&warrenv1.ResumeRequest{SandboxId: pos[0]}))
			if err != nil {
				return err
			}
			sb = res.Msg.GetSandbox()
		}
		return printSandboxes(stdout, cf.output, sb)
	case "files":
		pos, c, ctx, cancel, err := cf.start(fs, args, "ID", "PATH")
		if err != nil {
			return err
		}
		defer cancel()
		res, err := call(ctx, c, c.Sandboxes, warrenv1connect.SandboxServiceClient.ListFiles, &warrenv1.ListFilesRequest{SandboxId: pos[0], Path: pos[1]})
		if err != nil {
			return err
		}
		if cf.output == "json" {
			return printJSON(stdout, res.Msg)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		for _, f := range res.Msg.GetFiles() {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", os.FileMode(f.GetMode()), f.GetSize(), f.GetModifiedAt().AsTime().Format(time.RFC3339), termSafe(f.GetName(), false))
		}
		return tw.Flush()
	case "cp":
		pos, c, ctx, cancel, err := cf.start(fs, args, "SRC", "DST")
		if err != nil {
			return err
		}
		defer cancel()
		// -o has no effect: cp prints nothing but the file's bytes (to -).
		srcID, srcPath, srcRemote := splitRemote(pos[0])
		dstID, dstPath, dstRemote := splitRemote(pos[1])
		switch {
		case srcRemote && !dstRemote:
			res, err := call(ctx, c, c.Sandboxes, warrenv1connect.SandboxServiceClient.ReadFile, &warrenv1.ReadFileRequest{SandboxId: srcID, Path: srcPath})
			if err != nil {
				return err
			}
			if pos[1] == "-" {
				_, err = stdout.Write(res.Msg.GetData())
				return err
			}
			return writeLocal(pos[1], res.Msg.GetData(), os.FileMode(res.Msg.GetFile().GetMode()).Perm())
		case dstRemote && !srcRemote:
			var data []byte
			var mode *uint32 // stdin: the default, 0644
			if pos[0] == "-" {
				data, err = readAtMost(os.Stdin, noded.MaxFileBytes, "cp: stdin")
			} else {
				var fi os.FileInfo
				if fi, err = os.Stat(pos[0]); err == nil {
					mode = new(unixMode(fi.Mode())) // 0000 too
					if fi.Size() > noded.MaxFileBytes {
						return fmt.Errorf("cp: %s: %d bytes, over the limit of %d", pos[0], fi.Size(), noded.MaxFileBytes)
					}
					// Read within the limit whatever the size said: a pipe
					// (<(cmd)), a device or a growing file says 0 or less.
					var f *os.File
					if f, err = os.Open(pos[0]); err == nil {
						data, err = readAtMost(f, noded.MaxFileBytes, "cp: "+pos[0])
						f.Close()
					}
				}
			}
			if err != nil {
				return err
			}
			_, err = call(ctx, c, c.Sandboxes, warrenv1connect.SandboxServiceClient.WriteFile, &warrenv1.WriteFileRequest{SandboxId: dstID, Path: dstPath, Data: data, Mode: mode})
			return err
		}
		return errors.New("sandbox cp: one side must be ID:/PATH and the other a local file (or -)")
	case "exec":
		return execStatus(sandboxExec(fs, &cf, args, stdout, stderr))
	case "help", "-h", "--help":
		fmt.Fprint(stdout, sandboxUsage)
		return nil
	}
	fmt.Fprint(stderr, sandboxUsage)
	return fmt.Errorf("sandbox: unknown command %q", verb)
}

// execFailed is a failure of sandbox exec itself, not of the command it
// ran: the process exits with status (see execStatus), so that a script
// can tell a command's own exit 1 (grep found nothing) from a sandbox that
// was gone.
type execFailed struct {
	status int
	err    error
}

func (e *execFailed) Error() string { return e.err.Error() }
func (e *execFailed) Unwrap() error { return e.err }

// execStatus gives sandbox exec's own failures the statuses docker run
// and the shells use: 127 for a command not found, 126 for one that could
// not run, 125 for anything else (bad flags, an unreachable server, no
// such sandbox, a broken stream). A command's own exit code (exitCode),
// -h and success pass through.
func execStatus(err error) error {
	var code exitCode
	if err == nil || errors.As(err, &code) || errors.Is(err, flag.ErrHelp) {
		return err
	}
	status := 125
	if connect.CodeOf(err) == connect.CodeFailedPrecondition {
		if s := guest.StartFailureStatus(err.Error()); s != 0 {
			status = s
		}
	}
	return &execFailed{status: status, err: err}
}

// sandboxExec is sandbox exec: it runs a command in a sandbox, streams its
// output and returns exitCode for a non-zero exit.
func sandboxExec(fs *flag.FlagSet, cf *clientFlags, args []string, stdout, stderr io.Writer) error {
	setDefault(fs, "timeout", "0")
	cf.noLimit = true
	var env envFlag
	fs.Var(&env, "env", "extra environment, K=V (repeat it, or K=V,K2=V2)")
	dir := fs.String("dir", "", "working directory (absolute)")
	cmdTimeout := fs.Duration("cmd-timeout", 0, "kill the command's process group after this long (0: no limit)")
	stdin := fs.Bool("stdin", false, "send this process's stdin to the command")
	// Flags go before the command: after ID and the command's name,
	// every argument is the command's (a "--" before the command is
	// still taken as the end of warren's flags).
	pos, err := parseUpTo(fs, args, 2)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return errors.New("sandbox exec: want ID -- CMD...")
	}
	if *cmdTimeout < 0 {
		return fmt.Errorf("--cmd-timeout %v: must not be negative", *cmdTimeout)
	}
	// -o is taken and has no effect: the output is the command's own.
	// (Refusing -o json would break scripts that pass it to every
	// command; the command table is stable.)
	envm, err := parseEnv(env...)
	if err != nil {
		return err
	}
	c, err := cf.dial()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	if cf.timeout > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), cf.timeout)
	}
	defer cancel()
	req := &warrenv1.ExecRequest{SandboxId: pos[0], Command: pos[1:], Env: envm, Dir: *dir, TimeoutMs: guest.CeilMS(*cmdTimeout)}
	if *stdin {
		if req.Stdin, err = readAtMost(os.Stdin, noded.MaxStdinBytes, "stdin"); err != nil {
			return err
		}
	}
	st, err := c.Sandboxes().Exec(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	defer st.Close()
	for st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *warrenv1.ExecResponse_Stdout:
			// Output that cannot be written (a full disk, a closed
			// stdout) fails the command here, whatever its own exit.
			if _, err := stdout.Write(ev.Stdout); err != nil {
				return fmt.Errorf("sandbox exec: write the command's stdout: %w", err)
			}
		case *warrenv1.ExecResponse_Stderr:
			if _, err := stderr.Write(ev.Stderr); err != nil {
				return fmt.Errorf("sandbox exec: write the command's stderr: %w", err)
			}
		case *warrenv1.ExecResponse_Exit:
			if ev.Exit.GetTimedOut() {
				fmt.Fprintf(stderr, "warren: command timed out after %v\n", *cmdTimeout)
			}
			switch code := ev.Exit.GetCode(); {
			case code == 0:
				return nil
			case code < 1 || code > 255:
				// No process exits so; narrowed to a byte, 256
				// would read as 0, a success.
				return fmt.Errorf("sandbox exec: the command ended with exit code %d, outside 0..255", code)
			default:
				return exitCode(code)
			}
		}
	}
	if err := st.Err(); err != nil {
		return err
	}
	return errors.New("sandbox exec: the stream ended without an exit status")
}

func cmdPool(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, sandboxUsage)
		return errUsage
	}
	verb, args := args[0], args[1:]
	fs := flag.NewFlagSet("pool "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	node := fs.String("node", "", "only this node")
	var pools []*warrenv1.PoolStatus
	var unreachable, refused []string
	switch verb {
	case "set":
		pos, c, ctx, cancel, err := cf.start(fs, args, "TEMPLATE", "N")
		if err != nil {
			return err
		}
		defer cancel()
		v, err := strconv.ParseUint(pos[1], 10, 64)
		switch {
		case errors.Is(err, strconv.ErrRange) || err == nil && v > math.MaxUint32:
			// The servers refuse any target over 1000; one past the API's
			// 32-bit field is refused here with the same reason.
			return fmt.Errorf("pool set: N %s: over the limit of 1000 per node", pos[1])
		case err != nil || strconv.FormatUint(v, 10) != pos[1]:
			return fmt.Errorf("pool set: N %q: want a whole number", pos[1])
		}
		n := uint32(v)
		res, err := call(ctx, c, c.Sandboxes, warrenv1connect.SandboxServiceClient.SetPoolTarget, &warrenv1.SetPoolTargetRequest{Template: pos[0], Target: n, NodeId: *node})
		if err != nil {
			return err
		}
		pools, unreachable, refused = res.Msg.GetPools(), res.Msg.GetUnreachableNodes(), res.Msg.GetRefusedNodes()
	case "list", "ls":
		_, c, ctx, cancel, err := cf.start(fs, args)
		if err != nil {
			return err
		}
		defer cancel()
		res, err := call(ctx, c, c.Sandboxes, warrenv1connect.SandboxServiceClient.ListPools, &warrenv1.ListPoolsRequest{NodeId: *node})
		if err != nil {
			return err
		}
		pools, unreachable, refused = res.Msg.GetPools(), res.Msg.GetUnreachableNodes(), res.Msg.GetRefusedNodes()
	default:
		fmt.Fprint(stderr, sandboxUsage)
		return fmt.Errorf("pool: unknown command %q", verb)
	}
	warnNodes(stderr, unreachable, refused, "")
	if verb == "set" && len(pools) == 0 {
		if *node != "" {
			return fmt.Errorf("pool set: node %s did not take the target (%d refused, %d unreachable)", *node, len(refused), len(unreachable))
		}
		// The server answered without an error: the cluster's target is
		// recorded (it refuses one every answering node refused), and
		// each node takes it when its session opens. Exiting 1 said it
		// was not set when it was.
		fmt.Fprintf(stderr, "pool set: the cluster's target is recorded; no node has taken it yet (%d refused, %d unreachable): nodes take it when their session opens\n", len(refused), len(unreachable))
		return nil
	}
	if cf.output == "json" {
		for _, p := range pools {
			if err := printJSON(stdout, p); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tTEMPLATE\tTARGET\tREADY\tFILLING\tSTANDBY\tSNAPSHOT")
	for _, p := range pools {
		if p.GetNote() != "" {
			// A node that keeps no pool on purpose (the container driver).
			fmt.Fprintf(stderr, "note: node %s: %s (template %s)\n", p.GetNodeId(), p.GetNote(), p.GetTemplate())
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\n", p.GetNodeId(), p.GetTemplate(), p.GetTarget(), p.GetReady(), p.GetFilling(), p.GetStandby(), p.GetSnapshot())
	}
	return tw.Flush()
}

// warnNodes reports the nodes a call to every node missed, each given as
// "NODE: error": those that did not answer, and those that answered with
// an error of their own (refused). more follows a node that did not answer.
func warnNodes(w io.Writer, unreachable, refused []string, more string) {
	for _, u := range unreachable {
		node, err, _ := strings.Cut(u, ": ")
		fmt.Fprintf(w, "warning: node %s did not answer (%s)%s\n", node, err, more)
	}
	for _, r := range refused {
		node, err, _ := strings.Cut(r, ": ")
		fmt.Fprintf(w, "warning: node %s refused: %s\n", node, err)
	}
}

func setDefault(fs *flag.FlagSet, name, v string) {
	f := fs.Lookup(name)
	_ = f.Value.Set(v)
	f.DefValue = v
}

// deleteSandbox deletes sandbox id, trying the next server as call does.
// A delete carries no request id, so a try whose answer was lost (its
// server died after forwarding it, or the node's answer did not come
// back) may have deleted the sandbox: not_found on a later try is then
// success. (A try that could not connect sent nothing.)
func deleteSandbox(ctx context.Context, c *client.Client, id string) error {
	unsure := false
	return c.DoEach(ctx, attemptBound(ctx, c.NumServers()), func(ctx context.Context) error {
		_, err := c.Sandboxes().DeleteSandbox(ctx, connect.NewRequest(&warrenv1.DeleteSandboxRequest{SandboxId: id}))
		var op *net.OpError
		switch code := connect.CodeOf(err); {
		case err == nil:
		case code == connect.CodeNotFound && unsure:
			return nil
		case (code == connect.CodeUnavailable || code == connect.CodeDeadlineExceeded) && !(errors.As(err, &op) && op.Op == "dial"):
			unsure = true
		}
		return err
	})
}

// splitRemote splits "ID:/PATH".
func splitRemote(s string) (id, path string, ok bool) {
	id, path, ok = strings.Cut(s, ":")
	if !ok || !strings.HasPrefix(id, "sb-") {
		return "", "", false
	}
	return id, path, true
}

// envFlag is --env, given any number of times.
type envFlag []string

func (e *envFlag) String() string     { return strings.Join(*e, ",") }
func (e *envFlag) Set(v string) error { *e = append(*e, v); return nil }

// parseEnv parses --env's values: each K=V, or several joined by commas
// (K=V,K2=V2). A comma is taken as the value's own unless a shell
// variable's name and = follow it: PASS=x,y sets PASS to "x,y" (it split
// there, and was refused quoting "y", a piece of the value). Errors never
// quote a value: they are often tokens.
func parseEnv(items ...string) (map[string]string, error) {
	out := map[string]string{}
	for _, item := range items {
		var last string // the key of the item's last K=V
		for i, kv := range strings.Split(item, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if i > 0 && (!ok || !validEnvName(k)) {
				out[last] += "," + kv
				continue
			}
			if !ok || k == "" {
				return nil, errors.New("env: an item does not start with a name and = (want K=V)")
			}
			if _, dup := out[k]; dup { // kept only the last, silently
				return nil, fmt.Errorf("env: %s given twice", k)
			}
			out[k], last = v, k
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// validEnvName reports whether k is a name a shell takes for a variable:
// a letter or _, then letters, digits and _.
func validEnvName(k string) bool {
	for i, c := range k {
		if !(c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return k != ""
}

func printSandboxes(w io.Writer, output string, sbs ...*warrenv1.Sandbox) error {
	if output == "json" {
		for _, sb := range sbs {
			if err := printJSON(w, sb); err != nil {
				return err
			}
		}
		return nil
	}
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNODE\tTEMPLATE\tSTATE\tSTART\tCLAIM\tVCPUS\tMEM\tEGRESS\tEXPIRES\tTASK")
	for _, sb := range sbs {
		task := sb.GetTaskId()
		if task == "" {
			task = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.0fms\t%d\t%dMiB\t%s\t%s\t%s\n", sb.GetId(), sb.GetNodeId(), sb.GetTemplate(), sb.GetState(),
			sb.GetStart(), sb.GetClaimMs(), sb.GetLimits().GetVcpus(), sb.GetLimits().GetMemoryMb(), describeEgress(sb.GetEgress()),
			sb.GetExpiresAt().AsTime().Local().Format(time.RFC3339), task)
	}
	tw.Flush()
	_, err := w.Write(b.Bytes())
	return err
}

// egressPolicyFlags set a sandbox's egress policy.
type egressPolicyFlags struct {
	profile, allow, prefixes *string
}

func (e *egressPolicyFlags) register(fs *flag.FlagSet) {
	e.profile = fs.String("egress-profile", "", "egress profile: registries (the default: the package registries plus --egress-allow), custom (--egress-allow only) or none")
	e.allow = fs.String("egress-allow", "", "comma-separated host names the sandbox may reach, exact or *.suffix")
	e.prefixes = fs.String("egress-prefix", "", "comma-separated CIDR prefixes the sandbox may reach on every port (the only way to private or node addresses)")
}

// policy is the policy the flags give, nil when none was set.
func (e *egressPolicyFlags) policy(fs *flag.FlagSet) *warrenv1.EgressPolicy {
	set := false
	fs.Visit(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "egress-") {
			set = true
		}
	})
	if !set {
		return nil
	}
	return &warrenv1.EgressPolicy{Profile: *e.profile, Allow: splitComma(*e.allow), AllowPrefixes: splitComma(*e.prefixes)}
}

// describeEgress is a policy in a few words: "registries+2", "custom:3",
// "none", or "off" for a sandbox without a network.
func describeEgress(p *warrenv1.EgressPolicy) string {
	if p == nil {
		return "off"
	}
	s := p.GetProfile()
	if n := len(p.GetAllow()) + len(p.GetAllowPrefixes()); n > 0 {
		s += fmt.Sprintf("+%d", n)
	}
	return s
}

// writeLocal writes what `sandbox cp ID:/PATH LOCAL` read to path,
// atomically: a failed write (a full disk, a file size limit) leaves the
// old file whole, never a part of the new one. The file is replaced, not
// rewritten: a symlink's target is replaced, keeping the link; an
// existing file keeps its mode (as os.WriteFile keeps it), a new one gets
// perm less the umask, but the new file is the caller's and another hard
// link to the old one keeps the old contents. What is not a regular file
// (a device, a FIFO) is written in place, as before: there is nothing
// there to keep.
func writeLocal(path string, data []byte, perm os.FileMode) error {
	target := path
	if t, err := filepath.EvalSymlinks(path); err == nil {
		target = t
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	fi, err := os.Stat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// A dangling symlink is replaced by the file.
		return atomicfile.WriteFile(path, data, perm&^umask())
	case err != nil:
		return err
	case fi.IsDir():
		return fmt.Errorf("cp: %s is a directory", path)
	case !fi.Mode().IsRegular():
		return os.WriteFile(target, data, perm)
	}
	return atomicfile.WriteFile(target, data, fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
}

// umask is the process's file mode creation mask, which a file created
// by os.WriteFile would have had taken from its mode (atomicfile sets
// the mode it is given). Reading it sets it for a moment: no other file
// is made in the CLI meanwhile.
func umask() os.FileMode {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return os.FileMode(m)
}

// readAtMost reads r whole unless it holds more than max bytes: the call
// would be refused anyway, so the rest is not read into memory.
func readAtMost(r io.Reader, max int64, what string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: over the limit of %d bytes", what, max)
	}
	return b, nil
}

// ceilSeconds is d in whole seconds, rounded up, as the API's *_seconds
// fields take durations.
func ceilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second) // d + 1s - 1 wrapped for d near the largest duration
	if d%time.Second > 0 {
		s++
	}
	return s
}

// fitUint32 refuses a flag's value that the API's 32-bit field would
// wrap (--memory-mb 4294967424 became 128), naming the flag.
func fitUint32(flags map[string]uint) error {
	for _, name := range slices.Sorted(maps.Keys(flags)) {
		if v := flags[name]; v > math.MaxUint32 {
			return fmt.Errorf("%s %d: over %d", name, v, uint32(math.MaxUint32))
		}
	}
	return nil
}

// unixMode is a file's permission bits with setuid, setgid and sticky as
// Unix writes them (04000, 02000, 01000), the mode WriteFile takes: Go's
// FileMode keeps those three apart from Perm().
func unixMode(m os.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}
