package model

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// ErrScript marks an error of a Scripted provider's Call: its script has
// no turn for the request (the conversation went past its end), or the
// request is not one it takes. Asked again, it answers the same: the node
// fails the task with a model_error instead of retrying the step. Callers
// test for it with errors.Is; the message is not a test (a path the model
// chose can read "scripted:" too).
var ErrScript = errors.New("scripted")

// Scripted replays a JSONL file of assistant turns: no model is called.
// Each line is a Response's JSON ({"content":[...],"stop_reason":...,
// "usage":{...}}); the n-th call of a conversation (n assistant turns
// already in its messages) gets line n+1, so a resumed task gets the same
// turns again. The demo, the tests and the evaluation use it.
type Scripted struct {
	Path  string
	turns []Response
}

// NewScripted reads and checks a script file; errors name the line.
func NewScripted(path string) (*Scripted, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("scripted: %w", err)
	}
	return ParseScripted(path, b)
}

// ParseScripted checks a script given whole (a task spec carries it);
// name is what errors call it.
func ParseScripted(name string, b []byte) (*Scripted, error) {
	path := name
	s := &Scripted{Path: name}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		var r Response
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("scripted: %s:%d: %v", path, n, err)
		}
		if err := r.Usage.check(); err != nil {
			return nil, fmt.Errorf("scripted: %s:%d: usage: %v", path, n, err)
		}
		if r.StopReason == "" {
			r.StopReason = StopEndTurn
			if len(r.ToolUses()) > 0 {
				r.StopReason = StopToolUse
			}
		}
		for i, c := range r.Content {
			switch c.Type {
			case BlockText:
			case BlockToolUse:
				if c.Name == "" || !json.Valid(c.Input) {
					return nil, fmt.Errorf("scripted: %s:%d: content[%d]: a tool_use needs a name and JSON input", path, n, i)
				}
				if c.ID == "" {
					r.Content[i].ID = fmt.Sprintf("toolu_scripted_%d_%d", len(s.turns)+1, i)
				}
			default:
				return nil, fmt.Errorf("scripted: %s:%d: content[%d].type: %q is not text or tool_use", path, n, i, c.Type)
			}
		}
		if r.ID == "" {
			r.ID = fmt.Sprintf("msg_scripted_%d", len(s.turns)+1)
		}
		r.Model = "scripted"
		r.Raw = append(json.RawMessage(nil), line...)
		s.turns = append(s.turns, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("scripted: %s: %w", path, err)
	}
	if len(s.turns) == 0 {
		return nil, fmt.Errorf("scripted: %s has no turns", path)
	}
	return s, nil
}

// Name is "scripted".
func (*Scripted) Name() string { return "scripted" }

// Turns is how many turns the script has.
func (s *Scripted) Turns() int { return len(s.turns) }

// Call returns the turn after the conversation's last assistant turn.
func (s *Scripted) Call(ctx context.Context, req Request) (*Response, error) {
	if err := req.Check(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrScript, err)
	}
	n := req.Turn - 1
	if req.Turn <= 0 {
		n = 0
		for _, m := range req.Messages {
			if m.Role == RoleAssistant {
				n++
			}
		}
	}
	if n >= len(s.turns) {
		return nil, fmt.Errorf("%w: %s has %d turns; the conversation asks for turn %d", ErrScript, s.Path, len(s.turns), n+1)
	}
	r := s.turns[n]
	r.Content = append([]Block(nil), r.Content...)
	return &r, nil
}
