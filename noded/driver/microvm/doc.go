// Package microvm is the sandbox driver on QEMU's microvm machine: KVM
// where KVM really runs a guest, QEMU's software accelerator (TCG)
// otherwise. Each template gets a snapshot taken after boot; sandboxes are
// clones that map the snapshot's memory copy-on-write and get a qcow2
// overlay on the snapshot's disk; warm pools keep restored clones paused.
// Each QEMU runs in its own cgroup; the node re-adopts or destroys them
// after a restart and reaps orphans.
package microvm

// DefaultImageDir is the template store unless configured otherwise.
const DefaultImageDir = "/var/lib/warren/templates"
