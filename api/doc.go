// Package api holds warren's protobuf definitions (api/warren/...), the Go
// and Connect code generated from them (api/gen, committed; regenerate with
// `make proto`), and the JSON form of events shared by the SSE gateway and
// the CLI. It imports no other warren package.
package api
