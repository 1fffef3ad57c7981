package scheduler

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
)

// CmdType is the first byte of every encoded command. The high bit marks a
// command that an older server may ignore; any other unknown type is refused.
type CmdType byte

const (
	CmdBatch        CmdType = 0x01
	CmdCreateTask   CmdType = 0x02
	CmdAppendEvents CmdType = 0x03
	CmdSendMessage  CmdType = 0x04
	CmdDecide       CmdType = 0x05
	CmdCancelTask   CmdType = 0x06
	CmdGrantLease   CmdType = 0x07 // tests and tools: a lease without node accounting
	CmdSetMember    CmdType = 0x08
	CmdRegisterNode CmdType = 0x09
	CmdNodeOp       CmdType = 0x0a
	CmdApplyPlan    CmdType = 0x0b
	CmdSetPool      CmdType = 0x0c

	// FlagIgnorable on a type byte lets servers that do not know the type
	// skip it instead of refusing it.
	FlagIgnorable CmdType = 0x80
)

// ErrUnknownCommand is returned for a type byte this server does not know.
var ErrUnknownCommand = errors.New("unknown command type")

// ErrEmptyCommand is returned for a zero-length command.
var ErrEmptyCommand = errors.New("empty command")

func (t CmdType) String() string {
	switch t &^ FlagIgnorable {
	case CmdBatch:
		return "batch"
	case CmdCreateTask:
		return "create_task"
	case CmdAppendEvents:
		return "append_events"
	case CmdSendMessage:
		return "send_message"
	case CmdDecide:
		return "decide"
	case CmdCancelTask:
		return "cancel_task"
	case CmdGrantLease:
		return "grant_lease"
	case CmdSetMember:
		return "set_member"
	case CmdRegisterNode:
		return "register_node"
	case CmdNodeOp:
		return "node_op"
	case CmdApplyPlan:
		return "apply_plan"
	case CmdSetPool:
		return "set_pool"
	}
	return fmt.Sprintf("type_0x%02x", byte(t))
}

// Command is a decoded command: its type and its body. Body is nil for an
// ignorable command of an unknown type.
type Command struct {
	Type CmdType
	Body proto.Message
}

func newBody(t CmdType) proto.Message {
	switch t &^ FlagIgnorable {
	case CmdBatch:
		return &fsmv1.Batch{}
	case CmdCreateTask:
		return &fsmv1.CreateTask{}
	case CmdAppendEvents:
		return &fsmv1.AppendEvents{}
	case CmdSendMessage:
		return &fsmv1.SendMessage{}
	case CmdDecide:
		return &fsmv1.Decide{}
	case CmdCancelTask:
		return &fsmv1.CancelTask{}
	case CmdGrantLease:
		return &fsmv1.GrantLease{}
	case CmdSetMember:
		return &fsmv1.SetMember{}
	case CmdRegisterNode:
		return &fsmv1.RegisterNode{}
	case CmdNodeOp:
		return &fsmv1.NodeOp{}
	case CmdApplyPlan:
		return &fsmv1.ApplyPlan{}
	case CmdSetPool:
		return &fsmv1.SetPool{}
	}
	return nil
}

// typeOf returns the type byte for a command body.
func typeOf(m proto.Message) (CmdType, error) {
	switch m.(type) {
	case *fsmv1.Batch:
		return CmdBatch, nil
	case *fsmv1.CreateTask:
		return CmdCreateTask, nil
	case *fsmv1.AppendEvents:
		return CmdAppendEvents, nil
	case *fsmv1.SendMessage:
		return CmdSendMessage, nil
	case *fsmv1.Decide:
		return CmdDecide, nil
	case *fsmv1.CancelTask:
		return CmdCancelTask, nil
	case *fsmv1.GrantLease:
		return CmdGrantLease, nil
	case *fsmv1.SetMember:
		return CmdSetMember, nil
	case *fsmv1.RegisterNode:
		return CmdRegisterNode, nil
	case *fsmv1.NodeOp:
		return CmdNodeOp, nil
	case *fsmv1.ApplyPlan:
		return CmdApplyPlan, nil
	case *fsmv1.SetPool:
		return CmdSetPool, nil
	}
	return 0, fmt.Errorf("%w: %T", ErrUnknownCommand, m)
}

// EncodeCommand returns the type byte followed by the protobuf body.
func EncodeCommand(m proto.Message) ([]byte, error) {
	t, err := typeOf(m)
	if err != nil {
		return nil, err
	}
	if a, ok := m.(*fsmv1.AppendEvents); ok {
		if n, ok := sizeAppendEvents(a); ok {
			return appendAppendEvents(append(make([]byte, 0, 1+n), byte(t)), a), nil
		}
	}
	b := make([]byte, 1, 1+proto.Size(m))
	b[0] = byte(t)
	return proto.MarshalOptions{}.MarshalAppend(b, m)
}

// DecodeCommand decodes one command. It returns ErrUnknownCommand for an
// unknown type without the ignorable flag, and a Command with a nil Body for
// an unknown ignorable one.
func DecodeCommand(b []byte) (Command, error) {
	if len(b) == 0 {
		return Command{}, ErrEmptyCommand
	}
	t := CmdType(b[0])
	body := newBody(t)
	if body == nil {
		if t&FlagIgnorable != 0 {
			return Command{Type: t}, nil
		}
		return Command{}, fmt.Errorf("%w 0x%02x", ErrUnknownCommand, b[0])
	}
	if err := proto.Unmarshal(b[1:], body); err != nil {
		return Command{}, fmt.Errorf("decode %s: %w", t, err)
	}
	return Command{Type: t &^ FlagIgnorable, Body: body}, nil
}

// encodeBatch wraps already-encoded commands in one Batch command.
func encodeBatch(cmds [][]byte) []byte {
	b, err := EncodeCommand(&fsmv1.Batch{Commands: cmds})
	if err != nil {
		panic(err) // Batch is a known type: cannot happen
	}
	return b
}

// batchCommands returns the commands of an encoded batch (type byte
// CmdBatch, with or without FlagIgnorable) as sub-slices of b, where
// DecodeCommand would copy each into a fsmv1.Batch: every replica reads
// every raft entry this way, and the copy was a few percent of its CPU. It
// accepts and refuses exactly what DecodeCommand does
// (FuzzBatchCommands).
func batchCommands(b []byte) ([][]byte, error) {
	if len(b) == 0 || CmdType(b[0])&^FlagIgnorable != CmdBatch {
		return nil, fmt.Errorf("not a batch")
	}
	var cmds [][]byte
	if err := eachBytesField(b[1:], 1, func(c []byte) { cmds = append(cmds, c) }); err != nil {
		return nil, fmt.Errorf("decode batch: %w", err)
	}
	return cmds, nil
}
