package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/warrenhq/warren/bench/capacity"
)

func cmdBench(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "capacity" {
		return fmt.Errorf("bench: the only benchmark here is \"capacity\" (warren bench capacity [--preset default|ci])")
	}
	fs := flag.NewFlagSet("bench capacity", flag.ContinueOnError)
	preset := fs.String("preset", "default", "default (3 servers, 1,000 nodes, 40,000 tasks) or ci (3 servers, 50 nodes, 2,000 tasks)")
	nodes := fs.Int("nodes", 0, "simulated nodes (0: the preset's)")
	perProc := fs.Int("nodes-per-process", 0, "simulated nodes per node process (0: the preset's)")
	tasks := fs.Int("tasks", 0, "concurrent tasks (0: the preset's)")
	steps := fs.Int("steps", 0, "scripted model steps per task (0: the preset's, 40)")
	scale := fs.Float64("time-scale", 0, "divide step durations (median 20 s) by this (0: the preset's)")
	steady := fs.Duration("steady", 0, "how long to measure the steady state before the faults (0: the preset's)")
	check := fs.Int("check-logs", -1, "task logs to check at the end, 0 for all (-1: the preset's)")
	out := fs.String("out", "bench/results", "directory for capacity-PRESET.{json,md,svg} and the leader's profiles")
	bin := fs.String("warren", "", "warren binary for the servers and nodes (default: this one)")
	keep := fs.Bool("keep", false, "keep data directories and logs")
	timeout := fs.Duration("timeout", 0, "give up after this long (0: the preset's)")
	finish := fs.String("finish", "", "after the faults: run (wait for every task to succeed) or cancel (cancel every task and wait for all to end) (empty: the preset's: cancel for default, run for ci)")
	nice := fs.Int("fleet-nice", -1, "run the node processes at this nice(1) value, 0 for not niced (-1: the preset's, 0)")
	pos, err := parse(fs, args[1:])
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos); err != nil {
		return err
	}
	o, ok := capacity.Presets[*preset]
	if !ok {
		return fmt.Errorf("preset: %q is not default or ci", *preset)
	}
	set := func(dst *int, v int, name string) error {
		if v < 0 {
			return fmt.Errorf("%s: must not be negative", name)
		}
		if v > 0 {
			*dst = v
		}
		return nil
	}
	if err := errors.Join(set(&o.Nodes, *nodes, "nodes"), set(&o.NodesPerProcess, *perProc, "nodes-per-process"),
		set(&o.Tasks, *tasks, "tasks"), set(&o.Steps, *steps, "steps")); err != nil {
		return err
	}
	// Each value out of range is refused, naming its flag: a negative or
	// NaN one used to mean the preset's, silently.
	var errs []error
	if !(*scale >= 0) || math.IsInf(*scale, 0) { // NaN too
		errs = append(errs, fmt.Errorf("time-scale: %v must be a positive number (0: the preset's)", *scale))
	} else if *scale > 0 {
		o.TimeScale = *scale
	}
	if *steady < 0 {
		errs = append(errs, fmt.Errorf("steady: %v must not be negative (0: the preset's)", *steady))
	} else if *steady > 0 {
		o.SteadySeconds = steady.Seconds()
	}
	if *check < -1 {
		errs = append(errs, fmt.Errorf("check-logs: %d must be 0 (all) or more, or -1 (the preset's)", *check))
	} else if *check >= 0 {
		o.CheckLogs = *check
	}
	if *timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout: %v must not be negative (0: the preset's)", *timeout))
	} else if *timeout > 0 {
		o.Timeout = *timeout
	}
	if *nice < -1 {
		errs = append(errs, fmt.Errorf("fleet-nice: %d must be 0 to 19, or -1 (the preset's)", *nice))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	switch *finish {
	case "":
	case "run", "cancel":
		o.Finish = *finish
	default:
		return fmt.Errorf("finish: %q is not run or cancel", *finish)
	}
	if *nice > 19 {
		return fmt.Errorf("fleet-nice: %d is over 19, the lowest priority", *nice)
	}
	if *nice >= 0 {
		o.FleetNice = *nice
	}
	if o.Nodes%o.NodesPerProcess != 0 {
		return fmt.Errorf("nodes: %d is not a multiple of nodes-per-process %d", o.Nodes, o.NodesPerProcess)
	}
	o.Binary, o.OutDir, o.Keep = *bin, *out, *keep
	if o.Binary == "" {
		if o.Binary, err = os.Executable(); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return fmt.Errorf("out: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	rep, err := capacity.Run(ctx, o, stderr)
	if rep != nil {
		files, werr := capacity.Write(rep, o.OutDir)
		if werr != nil {
			return errors.Join(err, werr)
		}
		fmt.Fprint(stdout, rep.Markdown())
		fmt.Fprintf(stdout, "\nwrote %v in %s\n", files, time.Since(start).Round(time.Second))
		if err == nil && len(rep.Violations) > 0 {
			return fmt.Errorf("capacity: %d invariant violations (first: %s)", len(rep.Violations), rep.Violations[0])
		}
	}
	return err
}
