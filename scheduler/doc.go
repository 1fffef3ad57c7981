// Package scheduler is warren's replicated control plane: the commands and
// the state machine (FSM) that raft replicates into Pebble, group commit of
// writes into raft entries, snapshots, the raft wiring of a server, and the
// Connect API handlers (TaskService, ClusterService) plus the SSE gateway.
//
// It uses raftlog for the log store and the api packages for types. It never
// imports noded, agent, netlink, containerd or QEMU code.
package scheduler
