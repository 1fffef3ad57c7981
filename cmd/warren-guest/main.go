// Command warren-guest is the agent inside every sandbox. As PID 1 of a
// microVM it sets the guest up and supervises "warren-guest agent", which
// serves the host's calls on the virtio-serial port named "agent".
// "warren-guest serve --listen PATH [--container]" serves on a unix socket
// instead, for containers (where, as PID 1, it supervises a serving child
// and reaps orphans) and tests.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/warrenhq/warren/guest"
)

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if os.Getpid() == 1 && len(os.Args) > 1 && os.Args[1] == "serve" {
		// A container's init: serve as a child, reap orphans here.
		guest.Supervise(append(os.Args[1:], "--under-init"))
		return
	}
	if os.Getpid() == 1 {
		if err := guest.RunInit(); err != nil {
			fmt.Fprintln(os.Stderr, "warren-guest: init:", err)
			// PID 1 must not exit: the kernel would panic without a word.
			select {}
		}
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: warren-guest agent | serve --listen PATH")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "agent":
		if err := guest.RunAgent(logger); err != nil {
			fmt.Fprintln(os.Stderr, "warren-guest: agent:", err)
			os.Exit(1)
		}
	case "serve":
		fs := flag.NewFlagSet("serve", flag.ExitOnError)
		listen := fs.String("listen", "", "unix socket path to serve on (required)")
		cgroup := fs.String("cgroup", "", "cgroup v2 directory for commands (optional)")
		container := fs.Bool("container", false, "running in a container: leave the clock, entropy and hostname alone")
		underInit := fs.Bool("under-init", false, "set by a container's init for its agent: every other process in the pid namespace is a command's")
		_ = fs.Parse(os.Args[2:])
		if *listen == "" {
			fmt.Fprintln(os.Stderr, "warren-guest serve: --listen: required")
			os.Exit(2)
		}
		sys, err := guest.NewLinuxSystem(*cgroup)
		if err != nil {
			fmt.Fprintln(os.Stderr, "warren-guest serve:", err)
			os.Exit(1)
		}
		sys.Container = *container
		sys.UnderInit = *underInit
		_ = os.Remove(*listen)
		ln, err := net.Listen("unix", *listen)
		if err != nil {
			fmt.Fprintln(os.Stderr, "warren-guest serve:", err)
			os.Exit(1)
		}
		srv := &guest.Server{Sys: sys, Logger: logger}
		for {
			c, err := ln.Accept()
			if err != nil {
				fmt.Fprintln(os.Stderr, "warren-guest serve:", err)
				os.Exit(1)
			}
			go srv.Serve(c)
		}
	default:
		fmt.Fprintf(os.Stderr, "warren-guest: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}
