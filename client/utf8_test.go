package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// A string that is not UTF-8 (a CLI argument in Latin-1) cannot be sent:
// the call fails with invalid_argument naming the field, not the
// marshaller's internal error that names none.
func TestNotUTF8IsNamed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", 500) }))
	defer srv.Close()
	c, err := New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		call func() error
		want string
	}{
		{func() error {
			_, err := c.Tasks().SendMessage(ctx, connect.NewRequest(&warrenv1.SendMessageRequest{TaskId: "t", Text: "caf\xe9"}))
			return err
		}, "text: not UTF-8 text"},
		{func() error {
			_, err := c.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{Spec: &warrenv1.TaskSpec{Repo: "r", IssueTitle: "t\xff"}}))
			return err
		}, "spec.issue_title: not UTF-8 text"},
		{func() error {
			_, err := c.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{Spec: &warrenv1.TaskSpec{Labels: map[string]string{"team": "\xe9quipe"}}}))
			return err
		}, `spec.labels["team"]: not UTF-8 text`},
		{func() error {
			_, err := c.Tasks().CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{Spec: &warrenv1.TaskSpec{EgressAllow: []string{"a", "b\xff"}}}))
			return err
		}, "spec.egress_allow[1]: not UTF-8 text"},
		{func() error {
			st, err := c.Sandboxes().Exec(ctx, connect.NewRequest(&warrenv1.ExecRequest{SandboxId: "s", Command: []string{"cat", "caf\xe9"}}))
			if err != nil {
				return err
			}
			for st.Receive() {
			}
			return st.Err()
		}, "command[1]: not UTF-8 text"},
	} {
		err := tc.call()
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v, want invalid_argument: %s", err, tc.want)
		}
	}
}
