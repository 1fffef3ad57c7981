package scheduler

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	fsmv1 "github.com/warrenhq/warren/api/gen/warren/fsm/v1"
	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
)

// BenchmarkFSMAppend applies raft entries of 40 one-event appends (1 KiB
// payloads, each with a request id) to random tasks among 20,000 whose
// records were flushed to sstables, as on a loaded leader. live-cache=false
// is the baseline in the same run: every append reads its task from Pebble.
func BenchmarkFSMAppend(b *testing.B) {
	const tasks, perEntry = 20000, 40
	for _, cache := range []bool{true, false} {
		b.Run(fmt.Sprintf("live-cache=%v", cache), func(b *testing.B) {
			tf := newTestFSM(b)
			tf.fsm.noLive = !cache
			ids := seedTasks(tf, tasks, perEntry)
			if err := tf.db.Flush(); err != nil {
				b.Fatal(err)
			}
			benchAppends(b, tf, ids, perEntry, 1000)
		})
	}
}

// BenchmarkFSMAppendSorted applies raft entries of 200 one-event appends
// (256 B payloads, each with a request id) to random tasks among 256 live
// ones, as bench/appends does at 1024 writers. sorted=false is the
// baseline in the same run: the events go into the batch in the order they
// were appended instead of in key order (applier.evs).
func BenchmarkFSMAppendSorted(b *testing.B) {
	const tasks, perEntry = 256, 200
	for _, sorted := range []bool{true, false} {
		b.Run(fmt.Sprintf("sorted=%v", sorted), func(b *testing.B) {
			tf := newTestFSM(b)
			tf.fsm.unsorted = !sorted
			ids := seedTasks(tf, tasks, tasks)
			benchAppends(b, tf, ids, perEntry, 240)
		})
	}
}

// seedTasks creates n tasks, in raft entries of up to 500, then appends a
// first event to each, in entries of up to firstPer, which puts it in the
// live cache (when on), as the running state_changed event does in the
// cluster. It returns the tasks' ids.
func seedTasks(tf *testFSM, n, firstPer int) []string {
	ids := make([]string, n)
	for i := 0; i < n; i += 500 {
		var msgs []proto.Message
		for j := i; j < min(i+500, n); j++ {
			ids[j] = ulid.Make().String()
			msgs = append(msgs, &fsmv1.CreateTask{Id: ids[j], Tenant: "default", Spec: testSpec(), Time: timestamppb.New(t0)})
		}
		tf.ok(msgs...)
	}
	for i := 0; i < n; i += firstPer {
		var msgs []proto.Message
		for _, id := range ids[i:min(i+firstPer, n)] {
			msgs = append(msgs, &fsmv1.AppendEvents{TaskId: id, Events: []*warrenv1.EventInput{logEvent("first")}, Time: timestamppb.New(t0)})
		}
		tf.ok(msgs...)
	}
	return ids
}

// benchAppends times b.N raft entries of perEntry one-event appends, each
// with a request id and a log payload of an output of outputLen bytes, to
// tasks picked at random (with a fixed seed) from ids, and reports
// appends/s.
func benchAppends(b *testing.B, tf *testFSM, ids []string, perEntry, outputLen int) {
	payload := []byte(fmt.Sprintf(`{"output":%q}`, strings.Repeat("x", outputLen)))
	rng := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		msgs := make([]proto.Message, perEntry)
		for i := range msgs {
			msgs[i] = &fsmv1.AppendEvents{TaskId: ids[rng.IntN(len(ids))], RequestId: fmt.Sprint("r", n, "/", i),
				Events: []*warrenv1.EventInput{{Kind: KindLog, Payload: payload}}, Time: timestamppb.New(t0)}
		}
		tf.ok(msgs...)
	}
	b.ReportMetric(float64(b.N*perEntry)/b.Elapsed().Seconds(), "appends/s")
}
