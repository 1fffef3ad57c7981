// Package cluster starts, kills, restarts and removes a local warren cluster
// for the bench commands: real server processes built from cmd/warren, on
// free 127.0.0.1 ports, with data directories on disk. It also builds the
// binary when none is given and makes sure no process or directory outlives
// the bench (Run, Pdeathsig), and reads tasks the way the benches need
// (EachTask, FirstOwnerEvent).
//
// It is bench tooling: nothing outside bench/ may import it, and it imports
// only the public client API of warren (api/gen), never the scheduler.
package cluster
