package api

// Limits of the sandbox API, the same on the servers (which check them
// before forwarding a call to the sandbox's node) and on the nodes.
const (
	MaxSandboxFileBytes  = 32 << 20 // ReadFile and WriteFile carry a whole file
	MaxSandboxStdinBytes = 8 << 20  // an Exec's stdin, sent whole
)
