package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// A request with a list longer than validation allows is refused before
// it is decoded, naming the field, in both codecs: decoding a list of
// empty entries costs about 60 times its wire size, so one request of
// 33 MiB could take the server a few GB before validation refused it.
func TestLongListsAreRefusedBeforeDecoding(t *testing.T) {
	_, url, hc := leadingServer(t, 10*time.Second)
	ctx := context.Background()
	empties := make([]*warrenv1.EventInput, 40000) // 80 KB on the wire
	for i := range empties {
		empties[i] = &warrenv1.EventInput{}
	}
	spec := testSpec()
	spec.EgressAllow = make([]string, 40000)
	for i := range spec.EgressAllow {
		spec.EgressAllow[i] = "a"
	}
	for _, codec := range []struct {
		name string
		opts []connect.ClientOption
	}{{"proto", nil}, {"json", []connect.ClientOption{connect.WithProtoJSON()}}} {
		c := warrenv1connect.NewTaskServiceClient(hc, url, codec.opts...)
		_, err := c.AppendEvents(ctx, connect.NewRequest(&warrenv1.AppendEventsRequest{TaskId: zzTask, Events: empties}))
		wantRefused(t, codec.name+" AppendEvents", err, "events: over the limit of 256 entries")
		_, err = c.AppendEventsBatch(ctx, connect.NewRequest(&warrenv1.AppendEventsBatchRequest{Appends: []*warrenv1.AppendEventsRequest{
			{TaskId: zzTask, Events: empties[:1]}, {TaskId: zzTask, Events: empties}}}))
		wantRefused(t, codec.name+" AppendEventsBatch", err, "appends[1].events: over the limit of 256 entries")
		_, err = c.CreateTasks(ctx, connect.NewRequest(&warrenv1.CreateTasksRequest{Tasks: []*warrenv1.CreateTaskRequest{{Spec: spec}}}))
		wantRefused(t, codec.name+" CreateTasks", err, "tasks[0].spec.egress_allow: over the limit of 256 entries")
	}
}

func wantRefused(t *testing.T, what string, err error, want string) {
	t.Helper()
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: got %v, want invalid_argument naming %q", what, err, want)
	}
}

// The largest valid requests pass the count: the limits are validation's.
func TestValidListsPassTheCount(t *testing.T) {
	payload := []byte(`{"line":"` + strings.Repeat("x", 100) + `"}`)
	events := make([]*warrenv1.EventInput, MaxEventsPerAppend)
	for i := range events {
		events[i] = &warrenv1.EventInput{Kind: "log", Payload: payload}
	}
	batch := &warrenv1.AppendEventsBatchRequest{}
	for range MaxAppendsPerBatch {
		batch.Appends = append(batch.Appends, &warrenv1.AppendEventsRequest{TaskId: zzTask, Events: events})
	}
	spec := testSpec()
	for range maxEgress {
		spec.EgressAllow = append(spec.EgressAllow, "example.com")
	}
	creates := &warrenv1.CreateTasksRequest{}
	for range MaxCreatesPerBatch {
		creates.Tasks = append(creates.Tasks, &warrenv1.CreateTaskRequest{Spec: spec})
	}
	for _, m := range []proto.Message{batch, creates} {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkEntries(b, m.ProtoReflect().Descriptor()); err != nil {
			t.Errorf("%T of %d bytes: %v", m, len(b), err)
		}
		j, err := protojson.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkJSONEntries(j, m.ProtoReflect().Descriptor()); err != nil {
			t.Errorf("%T in JSON, %d bytes: %v", m, len(j), err)
		}
		if err := checkJSONEntries(append([]byte(" "), j...), m.ProtoReflect().Descriptor()); err != nil {
			t.Errorf("%T in JSON with a space first: %v", m, err)
		}
	}
}

// The counts never panic, whatever the bytes.
func FuzzCheckEntries(f *testing.F) {
	b, _ := proto.Marshal(&warrenv1.CreateTasksRequest{Tasks: []*warrenv1.CreateTaskRequest{{Spec: testSpec()}}})
	f.Add(b)
	j, _ := protojson.Marshal(&warrenv1.AppendEventsBatchRequest{Appends: []*warrenv1.AppendEventsRequest{{TaskId: zzTask, Events: []*warrenv1.EventInput{{Kind: "log"}}}}})
	f.Add(j)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, md := range []proto.Message{&warrenv1.CreateTasksRequest{}, &warrenv1.AppendEventsBatchRequest{}} {
			_ = checkEntries(b, md.ProtoReflect().Descriptor())
			_ = checkJSONEntries(b, md.ProtoReflect().Descriptor())
		}
	})
}

// An error lists at most maxProblems problems: a request of many bad
// entries within the counts got one line for each.
func TestAnErrorListsAtMostTwentyProblems(t *testing.T) {
	evs := make([]*warrenv1.EventInput, MaxEventsPerAppend)
	for i := range evs {
		evs[i] = &warrenv1.EventInput{Kind: "BAD KIND"}
	}
	err := validateAppend(&warrenv1.AppendEventsRequest{TaskId: zzTask, Events: evs})
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != maxProblems+1 || lines[maxProblems] != errMoreProblems.Error() || !strings.HasPrefix(lines[0], "events[0]") {
		t.Errorf("got %d lines, first %q, last %q; want %d problems and then %q", len(lines), lines[0], lines[len(lines)-1], maxProblems, errMoreProblems)
	}
	spec := testSpec()
	spec.EgressAllow = make([]string, 10*maxEgress)
	err = validateCreate(&warrenv1.CreateTaskRequest{Spec: spec})
	if n := strings.Count(err.Error(), "\n") + 1; n > maxProblems+1 || !strings.Contains(err.Error(), "2560 entries is over the limit of 256") {
		t.Errorf("got %d lines: %v", n, err)
	}
}

// BenchmarkCheckEntries: the count's cost against the decode it guards,
// on a batch of 1,024 appends of 8 events of about 150 bytes.
func BenchmarkCheckEntries(b *testing.B) {
	payload := []byte(`{"line":"` + strings.Repeat("x", 100) + `"}`)
	batch := &warrenv1.AppendEventsBatchRequest{}
	for range MaxAppendsPerBatch {
		a := &warrenv1.AppendEventsRequest{TaskId: zzTask, RequestId: "r"}
		for range 8 {
			a.Events = append(a.Events, &warrenv1.EventInput{Kind: "log", Payload: payload})
		}
		batch.Appends = append(batch.Appends, a)
	}
	data, err := proto.Marshal(batch)
	if err != nil {
		b.Fatal(err)
	}
	md := batch.ProtoReflect().Descriptor()
	b.Run("count", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if err := checkEntries(data, md); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if err := proto.Unmarshal(data, &warrenv1.AppendEventsBatchRequest{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A spec holding fields the server does not know is refused, naming where:
// it would be stored and sent along as it came, unchecked and unbounded.
func TestASpecWithUnknownFieldsIsRefused(t *testing.T) {
	unknown := protowire.AppendBytes(protowire.AppendTag(nil, 999, protowire.BytesType), make([]byte, 1<<20))
	spec := testSpec()
	spec.ProtoReflect().SetUnknown(unknown)
	err := validateCreate(&warrenv1.CreateTaskRequest{Spec: spec})
	if err == nil || !strings.Contains(err.Error(), "spec: holds field number 999") {
		t.Errorf("spec: got %v", err)
	}
	spec = testSpec()
	spec.Policy = []*warrenv1.PolicyRule{{Tier: "allow", Tool: "*"}, {Tier: "deny", Tool: "*"}}
	spec.Policy[1].ProtoReflect().SetUnknown(unknown)
	err = validateCreate(&warrenv1.CreateTaskRequest{Spec: spec})
	if err == nil || !strings.Contains(err.Error(), "spec.policy[1]: holds field number 999") {
		t.Errorf("spec.policy[1]: got %v", err)
	}
	spec.Policy[1].ProtoReflect().SetUnknown(nil)
	if err := validateCreate(&warrenv1.CreateTaskRequest{Spec: spec}); err != nil {
		t.Errorf("without them: %v", err)
	}
}

// A model script whose lines are not JSON objects is refused at submit,
// naming the line: it was placed, given a sandbox, and failed on its node.
func TestAModelScriptOfNoJSONIsRefused(t *testing.T) {
	spec := testSpec()
	spec.ModelScript = "# a comment\n\n{\"content\":[]}\nthis is not JSONL\n"
	err := validateCreate(&warrenv1.CreateTaskRequest{Spec: spec})
	if err == nil || !strings.Contains(err.Error(), "spec.model_script: line 4 is not a JSON object") {
		t.Errorf("got %v", err)
	}
	spec.ModelScript = "# a comment\n\n{\"content\":[]}\r\n  {\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}\n"
	if err := validateCreate(&warrenv1.CreateTaskRequest{Spec: spec}); err != nil {
		t.Errorf("a good script: %v", err)
	}
}

// The servers' sandbox API counts lists before decoding too: an exec of
// 200,000 empty arguments (a few KB gzipped) is refused naming the field
// instead of being decoded into millions of strings, then forwarded.
func TestSandboxListsAreRefusedBeforeDecoding(t *testing.T) {
	_, url, hc := leadingServer(t, 10*time.Second)
	cmd := make([]string, 200000)
	cmd[0] = "true"
	for _, codec := range []struct {
		name string
		opts []connect.ClientOption
	}{{"proto", []connect.ClientOption{connect.WithSendGzip()}}, {"json", []connect.ClientOption{connect.WithProtoJSON(), connect.WithSendGzip()}}} {
		c := warrenv1connect.NewSandboxServiceClient(hc, url, codec.opts...)
		st, err := c.Exec(context.Background(), connect.NewRequest(&warrenv1.ExecRequest{SandboxId: "sb-0000000000-n1", Command: cmd}))
		if err == nil {
			for st.Receive() {
			}
			err = st.Err()
		}
		wantRefused(t, codec.name+" Exec", err, "command: over the limit of 131072 entries")
	}
}

// Nesting no longer turns the JSON count off: past 64 levels (in a field
// the server does not know, which protojson skips however deep) it
// stopped counting, and the events after it went uncounted, so a request
// of millions of empty events was decoded before validation refused it.
func TestDeepJSONDoesNotHideALongList(t *testing.T) {
	deep := strings.Repeat("[", 70) + strings.Repeat("]", 70)
	events := strings.TrimSuffix(strings.Repeat("{},", 40000), ",")
	b := []byte(`{"x":` + deep + `,"taskId":"` + zzTask + `","events":[` + events + `]}`)
	md := (&warrenv1.AppendEventsRequest{}).ProtoReflect().Descriptor()
	if err := checkJSONEntries(b, md); err == nil || !strings.Contains(err.Error(), "nested deeper than 64 levels") {
		t.Errorf("deep value before a long list: %v, want it refused", err)
	}
	b = []byte(`{"taskId":"` + zzTask + `","events":[` + events + `]}`)
	if err := checkJSONEntries(b, md); err == nil || !strings.Contains(err.Error(), "events: over the limit of 256 entries") {
		t.Errorf("long list alone: %v", err)
	}
}

// A singular message field given twice is refused: proto.Unmarshal merges
// the two, lists and all, so each one's lists were counted apart and N
// copies of a spec with 64 policy rules decoded to 64×N rules.
func TestASpecGivenTwiceIsRefused(t *testing.T) {
	spec := testSpec()
	spec.Policy = make([]*warrenv1.PolicyRule, 64)
	for i := range spec.Policy {
		spec.Policy[i] = &warrenv1.PolicyRule{}
	}
	one, err := proto.Marshal(&warrenv1.CreateTaskRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	var twice []byte
	for range 2 {
		twice = append(twice, one...)
	}
	var merged warrenv1.CreateTaskRequest
	if err := proto.Unmarshal(twice, &merged); err != nil || len(merged.GetSpec().GetPolicy()) != 128 {
		t.Fatalf("decoding two specs: %d rules, %v (proto merges them)", len(merged.GetSpec().GetPolicy()), err)
	}
	md := merged.ProtoReflect().Descriptor()
	if err := checkEntries(twice, md); err == nil || !strings.Contains(err.Error(), "spec: given more than once") {
		t.Errorf("two specs: %v, want them refused", err)
	}
	if err := checkEntries(one, md); err != nil {
		t.Errorf("one spec: %v", err)
	}
}
