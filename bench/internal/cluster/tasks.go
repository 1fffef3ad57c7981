package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// EachTask calls fn for every task in state (all states when unspecified),
// a page of 1,000 at a time, each page allowed 30 s.
func EachTask(ctx context.Context, tasks warrenv1connect.TaskServiceClient, state warrenv1.TaskState, fn func(*warrenv1.Task)) error {
	for token := ""; ; {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := tasks.ListTasks(cctx, connect.NewRequest(&warrenv1.ListTasksRequest{State: state, PageSize: 1000, PageToken: token}))
		cancel()
		if err != nil {
			return err
		}
		for _, t := range resp.Msg.GetTasks() {
			fn(t)
		}
		if token = resp.Msg.GetNextPageToken(); token == "" {
			return nil
		}
	}
}

// OwnerState is what a lost task's log says after the kill.
type OwnerState int

const (
	NotYet      OwnerState = iota // no event from a new owner yet
	Recovered                     // the new owner recorded running at the returned time
	EndedBefore                   // it ended on the old node before the kill took effect
)

// FirstOwnerEvent returns when the task's new owner (epoch above old)
// recorded state_changed to running.
func FirstOwnerEvent(ctx context.Context, tasks warrenv1connect.TaskServiceClient, id string, old uint64) (time.Time, OwnerState, string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := tasks.GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: id}))
	if err != nil {
		return time.Time{}, NotYet, err.Error()
	}
	t := resp.Msg.GetTask()
	desc := fmt.Sprintf("%s %s on %q epoch %d (was %d)", id, t.GetState(), t.GetLease().GetNode(), t.GetLease().GetEpoch(), old)
	if t.GetLease().GetEpoch() <= old {
		if t.GetState() == warrenv1.TaskState_TASK_STATE_SUCCEEDED {
			return time.Time{}, EndedBefore, desc
		}
		return time.Time{}, NotYet, desc
	}
	st, err := tasks.StreamEvents(ctx, connect.NewRequest(&warrenv1.StreamEventsRequest{TaskId: id}))
	if err != nil {
		return time.Time{}, NotYet, desc
	}
	defer st.Close()
	last := t.GetNextSeq() - 1
	for st.Receive() {
		e := st.Msg().GetEvent()
		if e.GetEpoch() > old && e.GetKind() == "state_changed" {
			var p struct{ To string }
			if json.Unmarshal(e.GetPayload(), &p) == nil && p.To == "running" {
				return e.GetTime().AsTime(), Recovered, desc
			}
		}
		if e.GetSeq() >= last {
			break
		}
	}
	return time.Time{}, NotYet, desc
}
