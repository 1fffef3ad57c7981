package scheduler

import (
	"bytes"
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

// batchCommands reads a batch as DecodeCommand does: the same commands,
// and an error for the same inputs.
func FuzzBatchCommands(f *testing.F) {
	for _, m := range allCommands() {
		b, _ := EncodeCommand(m)
		f.Add(encodeBatch([][]byte{b, b}))
	}
	f.Add(encodeBatch(nil))
	f.Add([]byte{byte(CmdBatch)})
	f.Add([]byte{byte(CmdBatch | FlagIgnorable), 0x0a, 0x01, 0x02})
	f.Add([]byte{byte(CmdBatch), 0x0a, 0x05, 0x02})
	f.Add([]byte{byte(CmdBatch), 0x08, 0x01, 0x0a, 0x00, 0x13, 0x14})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 || CmdType(b[0])&^FlagIgnorable != CmdBatch {
			if _, err := batchCommands(b); err == nil {
				t.Fatal("a command that is not a batch was read as one")
			}
			return
		}
		got, err := batchCommands(b)
		c, werr := DecodeCommand(b)
		if (err == nil) != (werr == nil) {
			t.Fatalf("batchCommands error %v, DecodeCommand error %v", err, werr)
		}
		if err != nil {
			return
		}
		want := c.Body.(*fsmv1.Batch).GetCommands()
		if len(got) != len(want) {
			t.Fatalf("%d commands, DecodeCommand gives %d", len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("command %d: %x, DecodeCommand gives %x", i, got[i], want[i])
			}
		}
	})
}
