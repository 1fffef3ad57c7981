// Package container is the sandbox driver for hosts without QEMU: each
// sandbox is a containerd container run by runc (or gVisor's runsc through
// a runtime-binary wrapper), whose root is an overlay on the template's
// root file system and whose init is warren-guest serving the same
// protocol as in a microVM, on a unix socket bind-mounted from the host.
//
// It shares the host's kernel: the isolation is namespaces, cgroups, the
// default seccomp profile and the runtime's, not a VM's. It has no warm pool and no disk bound, and
// pause freezes the container in memory.
package container
