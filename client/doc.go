// Package client is the Go client of a warren cluster: typed Connect
// clients for TaskService and ClusterService over one or more server URLs,
// and Watch, which follows a task's event stream across reconnects and
// server failures without skipping or repeating a seq. It imports only api.
package client
