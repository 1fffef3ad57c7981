// Command warren is the warren server, dev cluster and CLI client. It only
// parses flags and wires packages together; see README.md for every command.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

const usage = `warren runs coding-agent tasks on your own machines.

Usage:
  warren server --id NAME --data DIR --api HOST:PORT --raft HOST:PORT [--bootstrap | --join API_URL]
                [--gossip HOST:PORT] [--join-gossip HOST:PORT,...]
  warren node --id NAME --data DIR --servers URL[,URL...] --gossip HOST:PORT [--join-gossip HOST:PORT,...]
              --driver auto|microvm|container|sim [--capacity cpu=N,mem=SIZE] [--labels k=v,...]
  warren dev [--data DIR] [--api HOST:PORT]
  warren task create --repo URL --base REV --title T [--body TEXT | --body-file F] [--model M]
                     [--driver D] [--max-steps N] [--max-tokens N] [--max-cost USD] [--max-wall-clock S]
  warren task get ID
  warren task list [--state S] [--limit N]
  warren task watch ID [--after SEQ]
  warren task steer ID TEXT
  warren task approve ID TOOL_CALL_ID [--comment C]
  warren task reject ID TOOL_CALL_ID [--comment C]
  warren task cancel ID [--reason R]
  warren cluster status
  warren cluster snapshot
  warren nodes list
  warren nodes cordon ID | uncordon ID | drain ID [--deadline DUR] | rm ID
  warren bench capacity [--preset default|ci] [--nodes N] [--tasks N] [--out DIR]
  warren sandbox create|exec|cp|files|get|egress|pause|resume|rm|ls (warren sandbox help)
  warren pool set TEMPLATE N | list
  warren image build [--name default] [--dir DIR] [--packages a,b] [--free-mb N]
  warren image list [--dir DIR]

Client commands take --server URL[,URL...] (default http://127.0.0.1:7480,
or $WARREN_SERVER) and -o text|json. Run "warren COMMAND -h" for its flags.
`

// errUsage marks an error whose message already says what to do.
var errUsage = errors.New("usage")

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		status := exitStatus(err)
		var code exitCode
		quiet := errors.As(err, &code) && int(code) == status
		if !quiet && !errors.Is(err, errUsage) && !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "warren:", termSafe(err.Error(), true))
		}
		os.Exit(status)
	}
}

// exitStatus is the process's exit status for run's error err: a
// command's own exit code (exitCode) if it is one a process can exit
// with, 1..255; sandbox exec's own failures 125..127 (execFailed); 0 for
// -h; 1 for any other error. Never 0 for a failure:
// os.Exit(256) exits 0.
func exitStatus(err error) int {
	var code exitCode
	if errors.As(err, &code) && code >= 1 && code <= 255 {
		return int(code)
	}
	var failed *execFailed
	if errors.As(err, &failed) && failed.status >= 1 && failed.status <= 255 {
		return failed.status
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 1
}

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	// "warren task -h" and the like: the verbs' commands answer with the
	// usage (the verb's own flags: "warren task create -h").
	if len(args) > 1 && slices.Contains([]string{"task", "tasks", "cluster", "nodes", "bench", "pool", "pools"}, args[0]) &&
		slices.Contains([]string{"-h", "-help", "--help", "help"}, args[1]) {
		fmt.Fprint(stdout, usage)
		return nil
	}
	switch args[0] {
	case "server":
		return cmdServer(args[1:], stderr)
	case "dev":
		return cmdDev(args[1:], stdout, stderr)
	case "task", "tasks":
		return cmdTask(args[1:], stdout, stderr)
	case "cluster":
		return cmdCluster(args[1:], stdout, stderr)
	case "nodes":
		return cmdNodes(args[1:], stdout, stderr)
	case "bench":
		return cmdBench(args[1:], stdout, stderr)
	case "sandbox", "sandboxes":
		return cmdSandbox(args[1:], stdout, stderr)
	case "pool", "pools":
		return cmdPool(args[1:], stdout, stderr)
	case "image", "images":
		return cmdImage(args[1:], stdout, stderr)
	case "node":
		if len(args) > 1 && slices.Contains([]string{"list", "ls", "cordon", "uncordon", "drain", "rm", "remove"}, args[1]) {
			return cmdNodes(args[1:], stdout, stderr) // "warren node list" reads as "nodes list"
		}
		return cmdNode(args[1:], stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

// parse parses flags that may come before, between or after positional
// arguments, and returns the positional ones. Everything after "--" is
// positional, flags or not.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	return parseUpTo(fs, args, 0)
}

// parseUpTo is parse, except that once it has n positional arguments (n >
// 0), the rest are positional too, flags or not: `sandbox exec ID ls -la`
// runs `ls -la`, as `docker exec` would, instead of failing on -la or, worse,
// taking a flag meant for the command (`env -dir`) as its own.
func parseUpTo(fs *flag.FlagSet, args []string, n int) ([]string, error) {
	// The flag package prints the error and the whole usage on a bad
	// flag; keep the usage for -h only, and say the error once (main
	// prints it) with where to find the flags.
	out := fs.Output()
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	defer fs.SetOutput(out)
	var pos []string
	for {
		if n > 0 && len(pos) >= n {
			return append(pos, args...), nil
		}
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				_, _ = buf.WriteTo(out)
				return nil, err
			}
			return nil, fmt.Errorf("%w\nrun `warren %s -h` for its flags", err, fs.Name())
		}
		left := fs.Args()
		if endedByDashes(fs, args, len(args)-len(left)) {
			return append(pos, left...), nil
		}
		if len(left) == 0 {
			return pos, nil
		}
		pos = append(pos, left[0])
		args = left[1:]
	}
}

// endedByDashes reports whether fs.Parse(args), having taken the first
// used arguments, stopped at a "--" (which it takes) rather than at a
// positional argument: the "--" is not the value of the flag before it.
func endedByDashes(fs *flag.FlagSet, args []string, used int) bool {
	if used == 0 || args[used-1] != "--" {
		return false
	}
	if used == 1 {
		return true
	}
	prev := args[used-2]
	if !strings.HasPrefix(prev, "-") || strings.Contains(prev, "=") {
		return true
	}
	f := fs.Lookup(strings.TrimLeft(prev, "-"))
	if f == nil {
		return true
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag() // a bool flag takes no value: "--" ended the flags
}

// wantArgs checks the count of positional arguments.
func wantArgs(fs *flag.FlagSet, pos []string, names ...string) error {
	if len(pos) == len(names) {
		return nil
	}
	return fmt.Errorf("%s: want %d argument(s) (%s), got %d", fs.Name(), len(names), strings.Join(names, " "), len(pos))
}
