package noded

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"
)

// The record of a failed task actor is sent again while the servers are
// out of reach, busy or without a leader, and not after a refusal, which
// would come again.
func TestRetryableAppend(t *testing.T) {
	for err, want := range map[error]bool{
		connect.NewError(connect.CodeUnavailable, errors.New("no leader")):          true,
		connect.NewError(connect.CodeDeadlineExceeded, errors.New("slow")):          true,
		connect.NewError(connect.CodeResourceExhausted, errors.New("busy")):         true,
		fmt.Errorf("append: %w", context.DeadlineExceeded):                          true,
		connect.NewError(connect.CodeFailedPrecondition, errors.New("stale epoch")): false,
		connect.NewError(connect.CodeInvalidArgument, errors.New("bad")):            false,
		connect.NewError(connect.CodeNotFound, errors.New("no task")):               false,
		context.Canceled: false,
	} {
		if got := retryableAppend(err); got != want {
			t.Errorf("%v: %v, want %v", err, got, want)
		}
	}
}
