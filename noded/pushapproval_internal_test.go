package noded

import (
	"testing"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// Only a request to push exactly this diff, and a decision of its id made
// after that request, count as the push's approval. Before, any approval
// of the id did: a model's tool call named like the push (which the
// gateway now renames) and approved as a harmless edit let an unreviewed
// diff be pushed.
func TestAPushIsApprovedOnlyAfterItsOwnRequest(t *testing.T) {
	const sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	id := "push-" + sha[:16]
	evt := func(kind, payload string) *warrenv1.Event {
		return &warrenv1.Event{Kind: kind, Payload: []byte(payload)}
	}
	toolAsked := evt("approval_requested", `{"tool_call_id":"`+id+`","tool":"edit_file","input":{"path":"go.mod"}}`)
	otherDiff := evt("approval_requested", `{"tool_call_id":"`+id+`","tool":"push","diff_sha256":"`+sha[:63]+`0"}`)
	pushAsked := evt("approval_requested", `{"tool_call_id":"`+id+`","tool":"push","diff_sha256":"`+sha+`"}`)
	yes := evt("approval_decided", `{"tool_call_id":"`+id+`","approved":true}`)
	no := evt("approval_decided", `{"tool_call_id":"`+id+`","approved":false,"comment":"no"}`)
	for _, c := range []struct {
		name                     string
		log                      []*warrenv1.Event
		asked, decided, approved bool
	}{
		{"nothing", nil, false, false, false},
		{"a tool call's approval", []*warrenv1.Event{toolAsked, yes}, false, false, false},
		{"another diff's push", []*warrenv1.Event{otherDiff, yes}, false, false, false},
		{"asked after a tool call's approval", []*warrenv1.Event{toolAsked, yes, pushAsked}, true, false, false},
		{"approved", []*warrenv1.Event{toolAsked, yes, pushAsked, yes}, true, true, true},
		{"rejected", []*warrenv1.Event{pushAsked, no}, true, true, false},
	} {
		p := pushApproval{id: id, sha: sha}
		for _, e := range c.log {
			p.see(e)
		}
		if p.asked != c.asked || p.decided != c.decided || p.approved != c.approved {
			t.Errorf("%s: asked %v decided %v approved %v, want %v %v %v", c.name, p.asked, p.decided, p.approved, c.asked, c.decided, c.approved)
		}
	}
}
