package scheduler

import (
	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/warrenhq/warren/internal/reqbound"
)

// A request's repeated fields are counted before it is decoded
// (internal/reqbound): decoding costs about 60 times the wire size for a
// list of empty entries, so a list longer than validation allows is
// refused, naming the field, before anything is allocated for it.

// maxEntries is the limit of each repeated field validation bounds (the
// same limits, so no request validation would take is refused).
var maxEntries = reqbound.Limits{
	"warren.v1.AppendEventsRequest.events":       MaxEventsPerAppend,
	"warren.fsm.v1.AppendEvents.events":          MaxEventsPerAppend,
	"warren.v1.AppendEventsBatchRequest.appends": MaxAppendsPerBatch,
	"warren.v1.CreateTasksRequest.tasks":         MaxCreatesPerBatch,
	"warren.v1.TaskSpec.egress_allow":            maxEgress,
	"warren.v1.TaskSpec.labels":                  maxLabels,
	"warren.v1.TaskSpec.node_selector":           maxLabels,
	"warren.v1.TaskSpec.policy":                  maxPolicyRules,
}

func checkEntries(b []byte, md protoreflect.MessageDescriptor) error {
	return reqbound.CheckEntries(maxEntries, b, md)
}

func checkJSONEntries(b []byte, md protoreflect.MessageDescriptor) error {
	return reqbound.CheckJSONEntries(maxEntries, b, md)
}

// boundedCodecs are the codecs of the servers' handlers.
func boundedCodecs() connect.Option { return reqbound.Codecs(maxEntries) }
