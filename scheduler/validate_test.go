package scheduler

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

func TestValidateCreate(t *testing.T) {
	good := func() *warrenv1.CreateTaskRequest {
		return &warrenv1.CreateTaskRequest{RequestId: "r1", Spec: &warrenv1.TaskSpec{
			Repo: "https://github.com/acme/calc.git", Base: "main", IssueTitle: "Fix add",
			Model: "claude-sonnet-4", EgressAllow: []string{"proxy.golang.org", "*.pypi.org"},
			Labels: map[string]string{"team": "core"}, Budgets: &warrenv1.Budgets{MaxSteps: 40},
		}}
	}
	if err := validateCreate(good()); err != nil {
		t.Fatalf("good request refused: %v", err)
	}
	for _, repo := range []string{"/srv/git/calc", "git@github.com:acme/calc.git", "file:///srv/calc", "ssh://git@host/x"} {
		r := good()
		r.Spec.Repo = repo
		if err := validateCreate(r); err != nil {
			t.Errorf("repo %q refused: %v", repo, err)
		}
	}
	cases := []struct {
		name  string
		mod   func(*warrenv1.CreateTaskRequest)
		field string
	}{
		{"no spec", func(r *warrenv1.CreateTaskRequest) { r.Spec = nil }, "spec: required"},
		{"no repo", func(r *warrenv1.CreateTaskRequest) { r.Spec.Repo = "" }, "spec.repo: required"},
		{"ftp repo", func(r *warrenv1.CreateTaskRequest) { r.Spec.Repo = "ftp://x/y" }, "spec.repo:"},
		{"relative repo", func(r *warrenv1.CreateTaskRequest) { r.Spec.Repo = "calc" }, "spec.repo:"},
		{"password in repo", func(r *warrenv1.CreateTaskRequest) { r.Spec.Repo = "https://u:p@h/x.git" }, `spec.repo: "https://h/x.git": the URL's user info`},
		{"token in repo", func(r *warrenv1.CreateTaskRequest) { r.Spec.Repo = "https://TOKEN@h/x.git" }, `spec.repo: "https://h/x.git": the URL's user info`},
		{"no base", func(r *warrenv1.CreateTaskRequest) { r.Spec.Base = "" }, "spec.base: required"},
		{"option base", func(r *warrenv1.CreateTaskRequest) { r.Spec.Base = "--upload-pack=x" }, "spec.base:"},
		{"no title", func(r *warrenv1.CreateTaskRequest) { r.Spec.IssueTitle = "" }, "spec.issue_title: required"},
		{"newline title", func(r *warrenv1.CreateTaskRequest) { r.Spec.IssueTitle = "a\nb" }, "spec.issue_title: contains control"},
		{"huge body", func(r *warrenv1.CreateTaskRequest) { r.Spec.IssueBody = strings.Repeat("x", maxBody+1) }, "spec.issue_body:"},
		{"bad model", func(r *warrenv1.CreateTaskRequest) { r.Spec.Model = "a b" }, "spec.model:"},
		{"negative budget", func(r *warrenv1.CreateTaskRequest) { r.Spec.Budgets.MaxTokens = -1 }, "spec.budgets.max_tokens:"},
		{"bad egress", func(r *warrenv1.CreateTaskRequest) { r.Spec.EgressAllow = []string{"ok.org", "no spaces"} }, "spec.egress_allow[1]:"},
		{"bad label", func(r *warrenv1.CreateTaskRequest) { r.Spec.Labels = map[string]string{"Bad Key": "v"} }, "spec.labels:"},
		{"bad selector", func(r *warrenv1.CreateTaskRequest) { r.Spec.NodeSelector = map[string]string{"Bad Key": "v"} }, "spec.node_selector:"},
		{"policy tier", func(r *warrenv1.CreateTaskRequest) { r.Spec.Policy = []*warrenv1.PolicyRule{{Tier: "maybe"}} }, "spec.policy[0].tier:"},
		{"policy tool", func(r *warrenv1.CreateTaskRequest) {
			r.Spec.Policy = []*warrenv1.PolicyRule{{Tier: "deny"}, {Tool: "rm", Tier: "deny"}}
		}, "spec.policy[1].tool:"},
		{"policy regexp", func(r *warrenv1.CreateTaskRequest) {
			r.Spec.Policy = []*warrenv1.PolicyRule{{Tool: "run_command", Command: "(curl", Tier: "deny"}}
		}, "spec.policy[0].command: not an RE2"},
		{"policy path", func(r *warrenv1.CreateTaskRequest) {
			r.Spec.Policy = []*warrenv1.PolicyRule{{Path: "../x", Tier: "deny"}}
		}, "spec.policy[0].path:"},
		{"bad tenant", func(r *warrenv1.CreateTaskRequest) { r.Tenant = "A!" }, "tenant:"},
		{"long request id", func(r *warrenv1.CreateTaskRequest) { r.RequestId = strings.Repeat("r", 200) }, "request_id:"},
		{"model and model_script", func(r *warrenv1.CreateTaskRequest) { r.Spec.ModelScript = `{"text":"done"}` }, `spec.model: "claude-sonnet-4" with a model_script`},
		{"bad template", func(r *warrenv1.CreateTaskRequest) { r.Spec.Template = "../etc" }, "spec.template:"},
		{"negative cpu", func(r *warrenv1.CreateTaskRequest) { r.Spec.Resources = &warrenv1.Resources{MilliCpu: -1} }, "spec.resources.milli_cpu:"},
		{"absurd cpu", func(r *warrenv1.CreateTaskRequest) {
			r.Spec.Resources = &warrenv1.Resources{MilliCpu: MaxTaskMilliCPU + 1}
		}, "spec.resources.milli_cpu:"},
		{"tiny memory", func(r *warrenv1.CreateTaskRequest) { r.Spec.Resources = &warrenv1.Resources{MemoryBytes: 1 << 20} }, "spec.resources.memory_bytes: must be 0 (the default) or from"},
		{"absurd memory", func(r *warrenv1.CreateTaskRequest) { r.Spec.Resources = &warrenv1.Resources{MemoryBytes: 1 << 62} }, "spec.resources.memory_bytes:"},
	}
	for _, tc := range cases {
		r := good()
		tc.mod(r)
		err := validateCreate(r)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: err = %v, want one naming %q", tc.name, err, tc.field)
		}
	}
	// Every problem is reported at once.
	r := good()
	r.Spec.Repo, r.Spec.Base, r.Spec.IssueTitle = "", "", ""
	err := validateCreate(r)
	for _, f := range []string{"spec.repo", "spec.base", "spec.issue_title"} {
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("combined error %v does not name %s", err, f)
		}
	}
}

func TestValidateAppend(t *testing.T) {
	id := "01J00000000000000000000000"
	cases := []struct {
		name  string
		req   *warrenv1.AppendEventsRequest
		field string
	}{
		{"bad id", &warrenv1.AppendEventsRequest{TaskId: "x", Events: []*warrenv1.EventInput{logEvent("a")}}, "task_id:"},
		// Ids are stored upper case; a lower-case one found nothing.
		{"lower-case id", &warrenv1.AppendEventsRequest{TaskId: strings.ToLower(id), Events: []*warrenv1.EventInput{logEvent("a")}}, "task_id: \"01j00000000000000000000000\": task ids are upper case (01J00000000000000000000000)"},
		{"no events", &warrenv1.AppendEventsRequest{TaskId: id}, "events: required"},
		{"unknown kind", &warrenv1.AppendEventsRequest{TaskId: id, Events: []*warrenv1.EventInput{{Kind: "nope"}}}, "events[0].kind: unknown"},
		{"server kind", &warrenv1.AppendEventsRequest{TaskId: id, Events: []*warrenv1.EventInput{{Kind: KindTaskCreated}}}, "events[0].kind:"},
		{"not json", &warrenv1.AppendEventsRequest{TaskId: id, Events: []*warrenv1.EventInput{logEvent("a"), {Kind: KindLog, Payload: []byte("[1]")}}}, "events[1].payload: not a JSON object"},
		// encoding/json takes any byte in a string; SSE and -o json would
		// print it.
		{"not utf-8", &warrenv1.AppendEventsRequest{TaskId: id, Events: []*warrenv1.EventInput{{Kind: KindLog, Payload: []byte("{\"a\":\"\xff\"}")}}}, "events[0].payload: not UTF-8 text"},
		{"too big", &warrenv1.AppendEventsRequest{TaskId: id, Events: []*warrenv1.EventInput{{Kind: KindLog, Payload: []byte(`{"x":"` + strings.Repeat("a", MaxPayloadBytes) + `"}`)}}}, "events[0].payload:"},
		{"bad state", &warrenv1.AppendEventsRequest{TaskId: id, Events: []*warrenv1.EventInput{{Kind: KindStateChanged, Payload: []byte(`{"to":"done"}`)}}}, "events[0].payload.to:"},
		{"no tool call", &warrenv1.AppendEventsRequest{TaskId: id, Events: []*warrenv1.EventInput{{Kind: KindApprovalRequested, Payload: []byte(`{}`)}}}, "events[0].payload.tool_call_id: required"},
		// One Approve and Reject refuse could never be decided.
		{"undecidable tool call", &warrenv1.AppendEventsRequest{TaskId: id, Events: []*warrenv1.EventInput{{Kind: KindApprovalRequested,
			Payload: []byte(`{"tool_call_id":"` + strings.Repeat("x", 200) + `"}`)}}}, "events[0].payload.tool_call_id: 200 bytes is over"},
		{"tool call on two lines", &warrenv1.AppendEventsRequest{TaskId: id, Events: []*warrenv1.EventInput{{Kind: KindApprovalRequested,
			Payload: []byte(`{"tool_call_id":"a\nb"}`)}}}, "events[0].payload.tool_call_id:"},
		// The FSM reads the key spelt exactly; encoding/json's struct
		// decoding (the nodes') matches any case and keeps the last.
		{"tool call id in upper case", &warrenv1.AppendEventsRequest{TaskId: id, Events: []*warrenv1.EventInput{{Kind: KindApprovalRequested,
			Payload: []byte(`{"TOOL_CALL_ID":"c1"}`)}}}, "events[0].payload.tool_call_id: read as \"\", and as \"c1\""},
		{"tool call id spelt twice", &warrenv1.AppendEventsRequest{TaskId: id, Events: []*warrenv1.EventInput{{Kind: KindApprovalRequested,
			Payload: []byte(`{"tool_call_id":"` + strings.Repeat("x", 200) + `","Tool_Call_Id":"ok"}`)}}}, "events[0].payload.tool_call_id: read as"},
		{"state spelt twice", &warrenv1.AppendEventsRequest{TaskId: id, Events: []*warrenv1.EventInput{{Kind: KindStateChanged,
			Payload: []byte(`{"to":"nope","TO":"running"}`)}}}, "events[0].payload.to: read as \"nope\""},
	}
	for _, tc := range cases {
		err := validateAppend(tc.req)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: err = %v, want one naming %q", tc.name, err, tc.field)
		}
	}
	if err := validateAppend(&warrenv1.AppendEventsRequest{TaskId: id, Events: []*warrenv1.EventInput{logEvent("a"), {Kind: KindToolCall}}}); err != nil {
		t.Fatalf("good append refused: %v", err)
	}
}

// FuzzValidateCreate: validation never panics, and an accepted request
// survives a protobuf round trip and still validates.
func FuzzValidateCreate(f *testing.F) {
	f.Add("r", "", "https://h/x.git", "main", "title", "body", "model", "a.org", "k", "v")
	f.Add("", "t", "/abs", "-x", "", "", "", "*.x", "K K", "")
	f.Add("\x00", "A", "git@h:x", "a b", "t\n", "\xff", "m m", "", "", "\x01")
	f.Fuzz(func(t *testing.T, reqID, tenant, repo, base, title, body, model, egress, lk, lv string) {
		r := &warrenv1.CreateTaskRequest{RequestId: reqID, Tenant: tenant, Spec: &warrenv1.TaskSpec{
			Repo: repo, Base: base, IssueTitle: title, IssueBody: body, Model: model,
			EgressAllow: []string{egress}, Labels: map[string]string{lk: lv},
		}}
		if validateCreate(r) != nil {
			return
		}
		b, err := proto.Marshal(r)
		if err != nil {
			t.Fatalf("accepted request does not marshal: %v", err)
		}
		var back warrenv1.CreateTaskRequest
		if err := proto.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if err := validateCreate(&back); err != nil {
			t.Fatalf("round trip broke validity: %v", err)
		}
	})
}

// A sandbox's template is NAME or NAME@VERSION, each a plain name: the
// version names a directory of the node's template store.
func TestValidTemplateRef(t *testing.T) {
	for ref, want := range map[string]bool{
		"default": true, "default@0e535c41c46cf00c": true, "py-3.12@v1": true,
		"default@": false, "@v1": false, "default@../../x": false, "default@..": false,
		"default@.x": false, "default@a/b": false, "../x": false, "Default": false, "a@b@c": false,
	} {
		if got := validTemplateRef(ref); got != want {
			t.Errorf("%q: %v, want %v", ref, got, want)
		}
	}
}
