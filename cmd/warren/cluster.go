package main

import (
	"flag"
	"fmt"
	"io"
	"text/tabwriter"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

func cmdCluster(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	verb, args := args[0], args[1:]
	fs := flag.NewFlagSet("cluster "+verb, flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	_, c, ctx, cancel, err := cf.start(fs, args)
	if err != nil {
		return err
	}
	defer cancel()
	switch verb {
	case "status":
		resp, err := call(ctx, c, c.Cluster, warrenv1connect.ClusterServiceClient.Status, &warrenv1.StatusRequest{})
		if err != nil {
			return err
		}
		if cf.output == "json" {
			return printJSON(stdout, resp.Msg)
		}
		m := resp.Msg
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "answered by\t%s (%s)\n", m.GetServerId(), m.GetRaftState())
		fmt.Fprintf(tw, "leader\t%s %s\n", m.GetLeaderId(), m.GetLeaderApiUrl())
		fmt.Fprintf(tw, "term\t%d\n", m.GetTerm())
		fmt.Fprintf(tw, "last log index\t%d\n", m.GetLastLogIndex())
		fmt.Fprintf(tw, "commit index\t%d\n", m.GetCommitIndex())
		fmt.Fprintf(tw, "applied index\t%d\n", m.GetAppliedIndex())
		fmt.Fprintf(tw, "last snapshot index\t%d\n", m.GetLastSnapshotIndex())
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "PEER\tSUFFRAGE\tRAFT\tAPI\tLEADER")
		for _, p := range m.GetPeers() {
			lead := ""
			if p.GetLeader() {
				lead = "*"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.GetId(), p.GetSuffrage(), p.GetRaftAddress(), p.GetApiUrl(), lead)
		}
		return tw.Flush()
	case "snapshot":
		resp, err := call(ctx, c, c.Cluster, warrenv1connect.ClusterServiceClient.Snapshot, &warrenv1.SnapshotRequest{})
		if err != nil {
			return err
		}
		if cf.output == "json" {
			return printJSON(stdout, resp.Msg)
		}
		_, err = fmt.Fprintf(stdout, "snapshot at index %d on %s\n", resp.Msg.GetIndex(), c.URL())
		return err
	}
	return fmt.Errorf("cluster: unknown verb %q (status, snapshot)", verb)
}
