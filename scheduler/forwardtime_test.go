package scheduler

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// The cluster API is reachable by whoever reaches the API port: a
// forwarded command's time is checked, since an event stamped in the year
// 14645 could not be written as JSON, and its task's SSE stream would fail
// on it for good.
func TestForwardedCommandsNeedAValidTime(t *testing.T) {
	id := "01JZ0000000000000000000000"
	far := timestamppb.New(time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC))
	far.Seconds += 400 * 366 * 86400
	for _, c := range []struct {
		name string
		ts   *timestamppb.Timestamp
		want string
	}{
		{"no time", nil, "time: required"},
		{"past 9999", far, "after 9999-12-31"},
		{"bad nanos", &timestamppb.Timestamp{Seconds: t0.Unix(), Nanos: -1}, "time: "},
	} {
		for _, m := range []Command{
			{Type: CmdSendMessage, Body: &fsmv1.SendMessage{TaskId: id, Text: "x", RequestId: "r", Time: c.ts}},
			{Type: CmdCancelTask, Body: &fsmv1.CancelTask{TaskId: id, RequestId: "r", Time: c.ts}},
			{Type: CmdAppendEvents, Body: &fsmv1.AppendEvents{TaskId: id, RequestId: "r", Events: []*warrenv1.EventInput{logEvent("x")}, Time: c.ts}},
		} {
			if err := validateForwarded(m); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s, %T: %v, want %q", c.name, m.Body, err, c.want)
			}
		}
	}
	ok := Command{Type: CmdSendMessage, Body: &fsmv1.SendMessage{TaskId: id, Text: "x", RequestId: "r", Time: timestamppb.New(t0)}}
	if err := validateForwarded(ok); err != nil {
		t.Errorf("a valid time: %v", err)
	}
}
