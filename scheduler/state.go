package scheduler

import warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"

// stateByName maps the lower-case names used in payloads and on the command
// line to states.
var stateByName = map[string]warrenv1.TaskState{
	"pending":          warrenv1.TaskState_TASK_STATE_PENDING,
	"placed":           warrenv1.TaskState_TASK_STATE_PLACED,
	"running":          warrenv1.TaskState_TASK_STATE_RUNNING,
	"waiting_approval": warrenv1.TaskState_TASK_STATE_WAITING_APPROVAL,
	"succeeded":        warrenv1.TaskState_TASK_STATE_SUCCEEDED,
	"failed":           warrenv1.TaskState_TASK_STATE_FAILED,
	"cancelled":        warrenv1.TaskState_TASK_STATE_CANCELLED,
}

// StateName is the lower-case name of a state ("running").
func StateName(s warrenv1.TaskState) string {
	for n, v := range stateByName {
		if v == s {
			return n
		}
	}
	return "unspecified"
}

// ParseState parses a lower-case state name; ok is false if unknown.
func ParseState(name string) (warrenv1.TaskState, bool) {
	s, ok := stateByName[name]
	return s, ok
}

// Terminal reports whether no further state change can follow.
func Terminal(s warrenv1.TaskState) bool {
	switch s {
	case warrenv1.TaskState_TASK_STATE_SUCCEEDED,
		warrenv1.TaskState_TASK_STATE_FAILED,
		warrenv1.TaskState_TASK_STATE_CANCELLED:
		return true
	}
	return false
}

// transitions lists the allowed state changes. Back to pending is a requeue
// (the node lost the task); terminal states have no way out.
var transitions = map[warrenv1.TaskState][]warrenv1.TaskState{
	warrenv1.TaskState_TASK_STATE_PENDING: {
		warrenv1.TaskState_TASK_STATE_PLACED,
		warrenv1.TaskState_TASK_STATE_FAILED,
		warrenv1.TaskState_TASK_STATE_CANCELLED,
	},
	warrenv1.TaskState_TASK_STATE_PLACED: {
		warrenv1.TaskState_TASK_STATE_RUNNING,
		warrenv1.TaskState_TASK_STATE_PENDING,
		warrenv1.TaskState_TASK_STATE_FAILED,
		warrenv1.TaskState_TASK_STATE_CANCELLED,
	},
	warrenv1.TaskState_TASK_STATE_RUNNING: {
		warrenv1.TaskState_TASK_STATE_WAITING_APPROVAL,
		warrenv1.TaskState_TASK_STATE_PENDING,
		warrenv1.TaskState_TASK_STATE_SUCCEEDED,
		warrenv1.TaskState_TASK_STATE_FAILED,
		warrenv1.TaskState_TASK_STATE_CANCELLED,
	},
	warrenv1.TaskState_TASK_STATE_WAITING_APPROVAL: {
		warrenv1.TaskState_TASK_STATE_RUNNING,
		warrenv1.TaskState_TASK_STATE_PENDING,
		warrenv1.TaskState_TASK_STATE_FAILED,
		warrenv1.TaskState_TASK_STATE_CANCELLED,
	},
}

// CanTransition reports whether from -> to is allowed.
func CanTransition(from, to warrenv1.TaskState) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}
