// Package guest is the agent that runs inside every sandbox (warren-guest)
// and the host-side client of its protocol.
//
// The protocol runs over one byte stream (a virtio-serial port in a
// microVM, a pipe or socket elsewhere), multiplexed with yamux so many calls
// run at once: the host opens one yamux stream per call, writes a request,
// and reads frames until the call's last frame. See proto.go.
//
// guest is a leaf: it imports no other warren package.
package guest
