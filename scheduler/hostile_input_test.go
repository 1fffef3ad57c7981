package scheduler

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

const zzTask = "01J00000000000000000000000"

func zzSeeds() []proto.Message {
	ts := timestamppb.New(t0)
	return []proto.Message{
		&fsmv1.CreateTask{Id: zzTask, Tenant: "t", RequestId: "r", Spec: testSpec(), Time: ts},
		&fsmv1.RegisterNode{Node: &warrenv1.Node{Id: "n1", Drivers: []string{DefaultDriver},
			Capacity: &warrenv1.Resources{MilliCpu: 3 * DefaultTaskMilliCPU, MemoryBytes: 3 * DefaultTaskMemoryBytes}}, Time: ts},
		&fsmv1.ApplyPlan{Placements: []*fsmv1.ApplyPlan_Placement{{TaskId: zzTask, NodeId: "n1"}}, Time: ts},
		&fsmv1.GrantLease{TaskId: zzTask, Node: "n1", Time: ts},
		&fsmv1.AppendEvents{TaskId: zzTask, LeaseEpoch: 1, Events: []*warrenv1.EventInput{stateEvent("running"), logEvent("x")}, Time: ts},
		&fsmv1.AppendEvents{TaskId: zzTask, LeaseEpoch: 1, ExpectedSeq: 9, RequestId: "q", Events: []*warrenv1.EventInput{{Kind: "usage", Payload: []byte(`{"input_tokens":1e400}`)}}, Time: ts},
		&fsmv1.AppendEvents{TaskId: zzTask, LeaseEpoch: 1, RequestId: "a", Events: []*warrenv1.EventInput{{Kind: "approval_requested", Payload: []byte(`{"tool_call_id":"c"}`)}}, Time: ts},
		&fsmv1.SendMessage{TaskId: zzTask, Text: "hi", RequestId: "m", Time: ts},
		&fsmv1.Decide{TaskId: zzTask, ToolCallId: "c", Approved: true, Time: ts},
		&fsmv1.CancelTask{TaskId: zzTask, Reason: "r", Time: ts},
		&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DRAIN, DrainDeadline: ts, Time: ts},
		&fsmv1.NodeOp{Id: "n1", Op: fsmv1.NodeOp_OP_DOWN, Time: ts},
		&fsmv1.SetMember{Id: "s1", RaftAddress: "127.0.0.1:1", ApiUrl: "http://127.0.0.1:2"},
		&fsmv1.SetPool{Template: "default", Target: 3},
	}
}

// FuzzApplyCommand: any command that decodes is applied (after a
// prelude that creates a task and a node) without a panic.
func FuzzApplyCommand(f *testing.F) {
	for _, m := range zzSeeds() {
		b, _ := EncodeCommand(m)
		f.Add(b, uint8(0))
		f.Add(b, uint8(5))
	}
	f.Fuzz(func(t *testing.T, b []byte, prelude uint8) {
		c, err := DecodeCommand(b)
		if err != nil {
			return
		}
		if bt, ok := c.Body.(*fsmv1.Batch); ok {
			for _, sub := range bt.GetCommands() {
				if _, err := DecodeCommand(sub); err != nil {
					return // the FSM panics on purpose on an undecodable command
				}
			}
		}
		db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem()})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		fsm, err := NewFSM(db, filepath.Join(t.TempDir(), "tmp"), discard)
		if err != nil {
			t.Fatal(err)
		}
		seeds := zzSeeds()
		idx := uint64(0)
		for i := 0; i < int(prelude)%len(seeds); i++ {
			eb, _ := EncodeCommand(seeds[i])
			idx++
			fsm.Apply(&raft.Log{Index: idx, Type: raft.LogCommand, Data: encodeBatch([][]byte{eb})})
		}
		idx++
		fsm.Apply(&raft.Log{Index: idx, Type: raft.LogCommand, Data: b})
		idx++
		fsm.Apply(&raft.Log{Index: idx, Type: raft.LogCommand, Data: encodeBatch([][]byte{b, b})})
		// Reads over what was written.
		_, _ = fsm.Events(zzTask, 0, 100)
	})
}

// FuzzReadTar: the snapshot archive reader refuses bad archives with an
// error, never a panic, never writes outside its directory.
func FuzzReadTar(f *testing.F) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: appliedEntry, Mode: 0o600, Size: 8, Typeflag: tar.TypeReg})
	tw.Write(binary.BigEndian.AppendUint64(nil, 5))
	tw.WriteHeader(&tar.Header{Name: "MANIFEST-000001", Mode: 0o600, Size: 3, Typeflag: tar.TypeReg})
	tw.Write([]byte("abc"))
	tw.Close()
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		parent := t.TempDir()
		dir := filepath.Join(parent, "db")
		_ = readTar(bytes.NewReader(b), dir, func(i uint64) bool { return i == 1 })
		ents, _ := filepath.Glob(filepath.Join(parent, "*"))
		if len(ents) != 1 {
			t.Fatalf("readTar wrote outside its dir: %v", ents)
		}
	})
}

// A snapshot whose applied-index key is not 8 bytes is refused with an
// error, as NewFSM refuses it; Restore must not panic on it.
func TestRestoreShortAppliedIndex(t *testing.T) {
	srcDir := filepath.Join(t.TempDir(), "src")
	src, err := pebble.Open(srcDir, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Set(keyApplied, []byte{1, 2, 3}, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := writeTar(&buf, srcDir, 0); err != nil {
		t.Fatal(err)
	}
	tf := newTestFSM(t)
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("Restore panicked on a snapshot with a 3-byte applied index: %v", r)
		}
	}()
	err = tf.fsm.Restore(io.NopCloser(&buf))
	t.Logf("Restore: %v", err)
}

// A wall-clock budget too large for a time.Duration is refused: noded
// takes time.Duration(max_wall_clock_seconds) * time.Second
// (noded/agentrun.go), and 18446744074 s wraps to 290 ms, so the task
// asking for "practically no limit" is stopped at once for max_wall_clock.
func TestWallClockBudgetOverflowRefused(t *testing.T) {
	secs := int64(18446744074)
	r := &warrenv1.CreateTaskRequest{RequestId: "r1", Spec: &warrenv1.TaskSpec{
		Repo: "https://github.com/acme/calc.git", Base: "main", IssueTitle: "Fix add",
		Budgets: &warrenv1.Budgets{MaxWallClockSeconds: secs}}}
	if err := validateCreate(r); err == nil {
		t.Errorf("max_wall_clock_seconds %d accepted; noded's budget becomes %v", secs, time.Duration(secs)*time.Second)
	}
}

// A snapshot archive of a few KiB that declares a PAX (GNU 1.0) sparse
// file, typeflag '0', with GNU.sparse.realsize as large as it likes and
// no data makes readTar write that many zero bytes to the disk:
// archive/tar expands the holes, and readTar copies whatever a regular
// entry reads. A corrupt or hostile snapshot fills the data disk.
func TestReadTarRefusesSparseFiles(t *testing.T) {
	const real = 256 << 20 // kept small here: nothing stops the copy
	rawHdr := func(name string, typ byte, size int) []byte {
		b := make([]byte, 512)
		copy(b[0:], name)
		copy(b[100:], "0000600\x00")
		copy(b[108:], "0000000\x00")
		copy(b[116:], "0000000\x00")
		copy(b[124:], fmt.Sprintf("%011o\x00", size))
		copy(b[136:], "00000000000\x00")
		b[156] = typ
		copy(b[257:], "ustar\x00")
		copy(b[263:], "00")
		for i := 148; i < 156; i++ {
			b[i] = ' '
		}
		sum := 0
		for _, c := range b {
			sum += int(c)
		}
		copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
		return b
	}
	pad := func(b []byte) []byte { return append(b, make([]byte, (512-len(b)%512)%512)...) }
	rec := func(k, v string) string {
		for l := 1; ; l++ {
			if r := fmt.Sprintf("%d %s=%s\n", l, k, v); len(r) == l {
				return r
			}
		}
	}
	recs := rec("GNU.sparse.major", "1") + rec("GNU.sparse.minor", "0") + rec("GNU.sparse.name", "000001.sst") +
		rec("GNU.sparse.realsize", fmt.Sprint(real))
	var buf bytes.Buffer
	buf.Write(rawHdr("PaxHeaders/x", 'x', len(recs)))
	buf.Write(pad([]byte(recs)))
	buf.Write(rawHdr("GNUSparseFile.0/000001.sst", '0', 512))
	buf.Write(pad([]byte("0\n")))
	buf.Write(make([]byte, 1024))
	dir := filepath.Join(t.TempDir(), "db")
	err := readTar(&buf, dir, func(uint64) bool { return false })
	var n int64
	if fi, _ := os.Stat(filepath.Join(dir, "000001.sst")); fi != nil {
		n = fi.Size()
	}
	t.Logf("readTar: %v; wrote %d MiB", err, n>>20)
	if n > 1<<20 {
		t.Errorf("a 3 KiB archive made readTar write %d MiB of zeros (realsize is the archive's to choose: 1<<40 fills the disk)", n>>20)
	}
}
