package capacity

import "time"

// Report is everything one run measured. It is written as JSON
// (capacity-<preset>.json), as a markdown table (capacity-<preset>.md) and
// as an SVG chart (capacity-<preset>.svg) under the output directory.
type Report struct {
	Preset  string    `json:"preset"`
	Started time.Time `json:"started"`
	Command string    `json:"command"` // how to rerun it
	Machine Machine   `json:"machine"`
	Config  Options   `json:"config"`

	// What was real and what was simulated, in words.
	Real      []string `json:"real"`
	Simulated []string `json:"simulated"`

	// Start-up.
	NodesReadySeconds float64 `json:"nodes_ready_seconds"` // from first node process start
	SubmitSeconds     float64 `json:"submit_seconds"`      // creating every task
	AllRunningSeconds float64 `json:"all_running_seconds"` // first CreateTask -> every task's actor recorded running
	PlacementsPerSec  float64 `json:"placements_per_sec"`  // tasks / AllRunningSeconds

	// Steady state (between all running and the first fault).
	Steady Window `json:"steady"`
	// The whole run.
	Overall Window `json:"overall"`

	// Raft apply batches on the leader during the steady window.
	ApplyEntries        uint64   `json:"apply_entries"`
	ApplyCommands       uint64   `json:"apply_commands"`
	CommandsPerEntry    float64  `json:"commands_per_entry"`
	CommandsPerEntryHis []uint64 `json:"commands_per_entry_histogram"` // bucket i: up to 2^i commands

	// Resources.
	LeaderCPUCores      float64 `json:"leader_cpu_cores"` // average during the steady window
	LeaderRSSBytes      int64   `json:"leader_rss_bytes"` // peak seen
	ServerRSSBytes      []int64 `json:"server_rss_bytes"` // peak per server
	NodeProcesses       int     `json:"node_processes"`
	NodesPerProcess     int     `json:"nodes_per_process"`
	NodeProcessRSSBytes int64   `json:"node_process_rss_bytes"` // median peak over node processes
	BytesPerTaskActor   float64 `json:"bytes_per_task_actor"`   // node process RSS growth / actors
	NodeCPUCores        float64 `json:"node_cpu_cores"`         // all node processes, steady window average
	ServerCPUCores      float64 `json:"server_cpu_cores"`       // all servers, steady window average

	// Fault phase 1: SIGKILL of KilledNodes nodes (whole node processes).
	KilledNodes   int     `json:"killed_nodes"`
	KilledTasks   int     `json:"killed_tasks"`   // tasks they held
	DetectSeconds float64 `json:"detect_seconds"` // kill -> last of them declared down
	// Nodes not killed whose status changed after the kill (declared down,
	// perhaps registered again since).
	Fault1FalseDowns int            `json:"fault1_false_downs"`
	DetectedBy       map[string]int `json:"detected_by"` // reason -> nodes
	RecoveryP50      float64        `json:"recovery_p50_seconds"`
	RecoveryP99      float64        `json:"recovery_p99_seconds"`
	RecoveryMax      float64        `json:"recovery_max_seconds"`
	RecoveredTasks   int            `json:"recovered_tasks"`

	// Fault phase 2: SIGKILL of the leader.
	FailoverSeconds float64 `json:"failover_seconds"` // kill -> first acknowledged append on the new leader
	FalseDownNodes  int     `json:"false_down_nodes"` // healthy nodes declared down afterwards, even if registered again since
	OldLeader       string  `json:"old_leader"`
	NewLeader       string  `json:"new_leader"`

	// The end.
	TotalSeconds  float64  `json:"total_seconds"`
	Succeeded     int      `json:"succeeded"`
	Cancelled     int      `json:"cancelled"` // with --finish cancel
	CheckedLogs   int      `json:"checked_logs"`
	CheckedEvents int      `json:"checked_events"`
	Violations    []string `json:"violations"` // invariant breaks; empty on a good run
	Goals         []Goal   `json:"goals"`
	ProfileTop    string   `json:"profile_top,omitempty"` // `go tool pprof -top` of the leader's CPU profile

	// One sample per second.
	Timeline []Sample `json:"timeline"`
	// Moments to mark on the chart.
	Marks []Mark `json:"marks"`
}

// Machine describes where it ran.
type Machine struct {
	CPUs     int    `json:"cpus"`
	MemBytes int64  `json:"mem_bytes"`
	OS       string `json:"os"`
	Kernel   string `json:"kernel"`
}

// Window summarises event appends over a span of the run. Events counts
// the events appended; Appends the append calls that carried them (a step
// appends its effect and tool_result in one call). Latency is per call.
type Window struct {
	Seconds       float64 `json:"seconds"`
	Events        uint64  `json:"events"`
	EventsPerSec  float64 `json:"events_per_sec"`
	Appends       uint64  `json:"appends"`
	AppendsPerSec float64 `json:"appends_per_sec"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	P999Ms        float64 `json:"p999_ms"`
	Errors        uint64  `json:"errors"`
}

// Sample is one second of the run.
type Sample struct {
	T             float64 `json:"t"` // seconds since the first task was submitted
	EventsPerSec  float64 `json:"events_per_sec"`
	AppendsPerSec float64 `json:"appends_per_sec"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	Running       int     `json:"running"`  // task actors alive
	Finished      int     `json:"finished"` // task actors that ended their task
	LeaderCPU     float64 `json:"leader_cpu_cores"`
	LeaderRSS     int64   `json:"leader_rss_bytes"`
}

// Mark is a moment on the chart (a fault).
type Mark struct {
	T     float64 `json:"t"`
	Label string  `json:"label"`
}

// Goal is one of the targets and whether this run met it.
type Goal struct {
	Name     string `json:"name"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
}
