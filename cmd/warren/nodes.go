package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/scheduler"
)

func cmdNodes(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	verb, args := args[0], args[1:]
	fs := flag.NewFlagSet("nodes "+verb, flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	switch verb {
	case "list", "ls":
		_, c, ctx, cancel, err := cf.start(fs, args)
		if err != nil {
			return err
		}
		defer cancel()
		resp, err := call(ctx, c, c.Cluster, warrenv1connect.ClusterServiceClient.ListNodes, &warrenv1.ListNodesRequest{})
		if err != nil {
			return err
		}
		if cf.output == "json" {
			for _, n := range resp.Msg.GetNodes() {
				if err := printJSON(stdout, n); err != nil {
					return err
				}
			}
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATUS\tELIGIBLE\tCPU (ALLOC/CAP)\tMEMORY (ALLOC/CAP)\tTASKS\tDRIVERS\tACCEL")
		for _, n := range resp.Msg.GetNodes() {
			fmt.Fprintf(tw, "%s\t%s\t%v\t%s/%s\t%s/%s\t%d\t%s\t%s\n", n.GetId(), scheduler.NodeStatusName(n.GetStatus()), n.GetEligible(),
				cores(n.GetAllocated().GetMilliCpu()), cores(n.GetCapacity().GetMilliCpu()),
				bytesIEC(n.GetAllocated().GetMemoryBytes()), bytesIEC(n.GetCapacity().GetMemoryBytes()),
				n.GetTaskCount(), driverNames(n.GetDrivers()), orDash(n.GetAccelerator()))
		}
		return tw.Flush()
	case "cordon", "uncordon", "drain", "rm", "remove":
		deadline := new(time.Duration)
		if verb == "drain" { // cordon and uncordon refuse it
			fs.DurationVar(deadline, "deadline", time.Hour, "how long tasks may take to move off")
		}
		pos, c, ctx, cancel, err := cf.start(fs, args, "ID")
		if err != nil {
			return err
		}
		defer cancel()
		var resp *connect.Response[warrenv1.NodeResponse]
		switch verb {
		case "cordon":
			resp, err = call(ctx, c, c.Cluster, warrenv1connect.ClusterServiceClient.CordonNode, &warrenv1.NodeRequest{Id: pos[0]})
		case "uncordon":
			resp, err = call(ctx, c, c.Cluster, warrenv1connect.ClusterServiceClient.UncordonNode, &warrenv1.NodeRequest{Id: pos[0]})
		case "rm", "remove":
			// Only a down node holding no lease: the servers say what to
			// do first when it is not one.
			resp, err = call(ctx, c, c.Cluster, warrenv1connect.ClusterServiceClient.RemoveNode, &warrenv1.NodeRequest{Id: pos[0]})
		default:
			if *deadline <= 0 {
				return fmt.Errorf("deadline: must be positive, got %v", *deadline)
			}
			// Under 1s must not become 0, the server's default (an hour).
			resp, err = call(ctx, c, c.Cluster, warrenv1connect.ClusterServiceClient.DrainNode, &warrenv1.DrainNodeRequest{Id: pos[0], DeadlineSeconds: ceilSeconds(*deadline)})
		}
		if err != nil {
			return err
		}
		n := resp.Msg.GetNode()
		if verb == "drain" && n.GetTaskCount() > 0 {
			// On stderr, so -o json's stdout stays one document.
			warnNoOtherNode(ctx, c, n, stderr)
		}
		if verb == "drain" {
			warnSandboxes(ctx, c, n.GetId(), stderr)
		}
		if cf.output == "json" {
			return printJSON(stdout, n)
		}
		if verb == "rm" || verb == "remove" {
			_, err = fmt.Fprintf(stdout, "node %s: removed (it was %s); its id may register again as a new node\n", n.GetId(), scheduler.NodeStatusName(n.GetStatus()))
			return err
		}
		_, err = fmt.Fprintf(stdout, "node %s: %s, eligible=%v, %d tasks\n", n.GetId(), scheduler.NodeStatusName(n.GetStatus()), n.GetEligible(), n.GetTaskCount())
		return err
	}
	return fmt.Errorf("nodes: unknown verb %q (list, cordon, uncordon, drain, rm)", verb)
}

func cores(milli int64) string { return fmt.Sprintf("%.1f", float64(milli)/1000) }

func bytesIEC(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%dB", b)
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// driverNames lists drivers, naming the simulated one as such.
func driverNames(ds []string) string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d
		if d == "sim" {
			out[i] = "sim(simulated)"
		}
	}
	return strings.Join(out, ",")
}

// warnNoOtherNode warns, after a drain, when no other node that is ready
// and eligible runs a driver of the drained one: its tasks then go back to
// pending and wait there (a drain reported success, and they waited with
// no word). Tasks may need more (a template, labels): this catches the
// case of a node that was the only one of its kind.
// warnSandboxes warns that a drained node still runs sandboxes made with
// the sandbox API: a drain moves tasks, not those, and an operator who
// stops the node once it says 0 tasks ends them with it. A node that does
// not answer the list says nothing here (the drain itself worked).
func warnSandboxes(ctx context.Context, c *client.Client, node string, stderr io.Writer) {
	resp, err := call(ctx, c, c.Sandboxes, warrenv1connect.SandboxServiceClient.ListSandboxes, &warrenv1.ListSandboxesRequest{NodeId: node})
	if err != nil {
		return
	}
	var ids []string
	for _, sb := range resp.Msg.GetSandboxes() {
		if sb.GetTaskId() == "" {
			ids = append(ids, sb.GetId())
		}
	}
	if len(ids) == 0 {
		return
	}
	named := strings.Join(ids[:min(len(ids), 3)], ", ")
	if len(ids) > 3 {
		named += ", …"
	}
	fmt.Fprintf(stderr, "warning: node %s runs %d sandboxes made with the sandbox API (%s): a drain does not move or end them; they end at their TTL or with `warren sandbox rm`, and go with the node if it is stopped\n",
		node, len(ids), named)
}

func warnNoOtherNode(ctx context.Context, c *client.Client, drained *warrenv1.Node, stderr io.Writer) {
	resp, err := call(ctx, c, c.Cluster, warrenv1connect.ClusterServiceClient.ListNodes, &warrenv1.ListNodesRequest{})
	if err != nil {
		return
	}
	for _, n := range resp.Msg.GetNodes() {
		if n.GetId() == drained.GetId() || n.GetStatus() != warrenv1.NodeStatus_NODE_STATUS_READY || !n.GetEligible() {
			continue
		}
		for _, d := range drained.GetDrivers() {
			if slices.Contains(n.GetDrivers(), d) {
				return
			}
		}
	}
	fmt.Fprintf(stderr, "warning: no other ready, eligible node runs %s: node %s's %d tasks will wait pending until one does (or `warren nodes uncordon %s`)\n",
		strings.Join(drained.GetDrivers(), " or "), drained.GetId(), drained.GetTaskCount(), drained.GetId())
}
