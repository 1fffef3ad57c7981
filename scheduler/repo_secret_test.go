package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// A repository URL whose user info is a token (https://TOKEN@host/...,
// the usual way to put a GitHub/GitLab token in a git URL) is refused by
// CreateTask, without quoting the token: accepted, it would be stored in
// the replicated spec, returned by GetTask and ListTasks, and written
// into the task_created event.
func TestRepoTokenAsUserInfoIsRefused(t *testing.T) {
	const secret = "sk-test-SECRET"
	n := startSingle(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	spec := testSpec()
	spec.Repo = "https://" + secret + "@github.com/acme/calc.git"
	resp, err := n.tasks.CreateTask(ctx, connect.NewRequest(&warrenv1.CreateTaskRequest{RequestId: "req-1", Spec: spec}))
	if err != nil {
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("want invalid_argument, got %v", err)
		}
		if strings.Contains(err.Error(), secret) {
			t.Fatalf("the refusal repeats the token: %v", err)
		}
		return
	}
	id := resp.Msg.GetTask().GetId()
	var where []string
	if strings.Contains(resp.Msg.GetTask().GetSpec().GetRepo(), secret) {
		where = append(where, "CreateTask response")
	}
	if g, err := n.tasks.GetTask(ctx, connect.NewRequest(&warrenv1.GetTaskRequest{Id: id})); err == nil && strings.Contains(g.Msg.GetTask().GetSpec().GetRepo(), secret) {
		where = append(where, "GetTask")
	}
	if l, err := n.tasks.ListTasks(ctx, connect.NewRequest(&warrenv1.ListTasksRequest{})); err == nil {
		for _, tk := range l.Msg.GetTasks() {
			if strings.Contains(tk.GetSpec().GetRepo(), secret) {
				where = append(where, "ListTasks")
			}
		}
	}
	if evs, err := n.tasks.ListEvents(ctx, connect.NewRequest(&warrenv1.ListEventsRequest{TaskId: id})); err == nil {
		for _, e := range evs.Msg.GetEvents() {
			if strings.Contains(string(e.GetPayload()), secret) {
				where = append(where, "event "+e.GetKind())
			}
		}
	}
	t.Fatalf("a repo URL with a token as its user info was accepted; the token is in: %s", strings.Join(where, ", "))
}

// A refusal of a repository URL quotes the URL whole, password included
// (the "has no host" and url.Parse errors).
func TestRepoRefusalDoesNotEchoPassword(t *testing.T) {
	const secret = "sk-test-SECRET"
	for _, repo := range []string{
		"https://u:" + secret + "@/x.git",          // no host
		"https://u:" + secret + "@host:port/x.git", // url.Parse: invalid port
		"https://u:pa/" + secret + "@host/x.git",   // a '/' in the password ends the authority early
	} {
		r := &warrenv1.CreateTaskRequest{RequestId: "r1", Spec: testSpec()}
		r.Spec.Repo = repo
		err := validateCreate(r)
		if err == nil {
			t.Errorf("%q accepted", repo)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the refusal of a repo URL repeats its password: %v", err)
		}
	}
}
