package scheduler

import (
	"encoding/binary"

	"github.com/cockroachdb/pebble/v2"

	"github.com/warrenhq/warren/raftlog"
)

// The FSM's keyspaces inside the server's Pebble database. All of them lie
// in [raftlog.FSMPrefixStart, raftlog.FSMPrefixEnd), which raftlog never
// touches; a snapshot is a checkpoint of exactly that span.
const (
	prefixApplied  = raftlog.FSMPrefixStart + 0 // applied index (8 bytes BE)
	prefixTask     = raftlog.FSMPrefixStart + 1 // task id -> warren.v1.Task
	prefixEvent    = raftlog.FSMPrefixStart + 2 // task id, seq BE -> warren.v1.Event (no task_id)
	prefixIdem     = raftlog.FSMPrefixStart + 3 // scope, 0, request id -> fsm.v1.Result
	prefixState    = raftlog.FSMPrefixStart + 4 // state byte, task id -> empty
	prefixMember   = raftlog.FSMPrefixStart + 5 // server id -> fsm.v1.Member
	prefixNode     = raftlog.FSMPrefixStart + 6 // node id -> warren.v1.Node
	prefixNodeTask = raftlog.FSMPrefixStart + 7 // node id, 0, task id -> empty: the leases a node holds
	prefixPool     = raftlog.FSMPrefixStart + 8 // template -> fsm.v1.SetPool: warm-pool targets
	prefixFSMLimit = raftlog.FSMPrefixEnd
)

var keyApplied = []byte{prefixApplied}

func keyTask(id string) []byte { return append([]byte{prefixTask}, id...) }

// keyEvent is the task id followed by the big-endian seq, so a task's
// events sort by seq. Task ids are fixed-length ULIDs, so no separator is
// needed between id and seq.
func keyEvent(id string, seq uint64) []byte {
	return appendKeyEvent(make([]byte, 0, 1+len(id)+8), id, seq)
}

func appendKeyEvent(k []byte, id string, seq uint64) []byte {
	k = append(k, prefixEvent)
	k = append(k, id...)
	return binary.BigEndian.AppendUint64(k, seq)
}

func keyIdem(scope, requestID string) []byte {
	k := make([]byte, 0, 2+len(scope)+len(requestID))
	k = append(k, prefixIdem)
	k = append(k, scope...)
	k = append(k, 0)
	return append(k, requestID...)
}

func keyState(state byte, id string) []byte {
	return append([]byte{prefixState, state}, id...)
}

func keyMember(id string) []byte { return append([]byte{prefixMember}, id...) }

func keyPool(template string) []byte { return append([]byte{prefixPool}, template...) }

func keyNode(id string) []byte { return append([]byte{prefixNode}, id...) }

// keyNodeTasks is the prefix of a node's lease index; node ids never hold
// a 0 byte (validation), so the separator keeps prefixes apart.
func keyNodeTasks(node string) []byte {
	return append(append([]byte{prefixNodeTask}, node...), 0)
}

func keyNodeTask(node, task string) []byte { return append(keyNodeTasks(node), task...) }

// eventsFrom iterates task id's events in r from seq on.
func eventsFrom(r pebble.Reader, id string, seq uint64) (*pebble.Iterator, error) {
	return r.NewIter(&pebble.IterOptions{
		LowerBound: keyEvent(id, seq),
		UpperBound: prefixEnd(append([]byte{prefixEvent}, id...)),
	})
}

// prefixEnd returns the smallest key greater than every key with prefix p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}
