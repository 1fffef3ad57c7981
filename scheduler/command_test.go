package scheduler

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

func allCommands() []proto.Message {
	ts := timestamppb.New(t0)
	return []proto.Message{
		&fsmv1.Batch{Commands: [][]byte{{byte(CmdSetMember)}}},
		&fsmv1.CreateTask{Id: "01J00000000000000000000000", Tenant: "t", RequestId: "r", Spec: testSpec(), Time: ts},
		&fsmv1.AppendEvents{TaskId: "x", LeaseEpoch: 3, Events: []*warrenv1.EventInput{{Kind: "log", Payload: []byte(`{}`)}}, Time: ts},
		&fsmv1.SendMessage{TaskId: "x", Text: "hi", Time: ts},
		&fsmv1.Decide{TaskId: "x", ToolCallId: "c", Approved: true, Time: ts},
		&fsmv1.CancelTask{TaskId: "x", Reason: "r", Time: ts},
		&fsmv1.GrantLease{TaskId: "x", Node: "n", Time: ts},
		&fsmv1.SetMember{Id: "s1", RaftAddress: "127.0.0.1:1", ApiUrl: "http://127.0.0.1:2"},
		&fsmv1.SetPool{Template: "default", Target: 3},
	}
}

func TestCommandRoundTrip(t *testing.T) {
	for _, m := range allCommands() {
		b, err := EncodeCommand(m)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		c, err := DecodeCommand(b)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		if !proto.Equal(c.Body, m) {
			t.Fatalf("%s: round trip changed the body", c.Type)
		}
	}
}

func TestDecodeCommandErrors(t *testing.T) {
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrEmptyCommand},
		{"unknown type", []byte{0x55, 0x01}, ErrUnknownCommand},
	}
	for _, tc := range cases {
		if _, err := DecodeCommand(tc.in); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	// A corrupt body of a known type is an error, not a panic.
	if _, err := DecodeCommand([]byte{byte(CmdCreateTask), 0x0a, 0xff}); err == nil {
		t.Error("truncated body decoded")
	}
	c, err := DecodeCommand([]byte{byte(FlagIgnorable | 0x55), 0x01})
	if err != nil || c.Body != nil {
		t.Errorf("ignorable unknown: %v, %v", c, err)
	}
}

// FuzzDecodeCommand: no input crashes the decoder, and whatever decodes
// re-encodes to something that decodes to the same thing.
func FuzzDecodeCommand(f *testing.F) {
	for _, m := range allCommands() {
		b, _ := EncodeCommand(m)
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCommand(b)
		if err != nil || c.Body == nil {
			return
		}
		again, err := EncodeCommand(c.Body)
		if err != nil {
			t.Fatalf("re-encode %s: %v", c.Type, err)
		}
		c2, err := DecodeCommand(again)
		if err != nil || !proto.Equal(c.Body, c2.Body) {
			t.Fatalf("re-decode %s: %v", c.Type, err)
		}
	})
}
