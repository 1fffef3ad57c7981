package microvm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// cgroups puts each QEMU process in its own cgroup under "warren", with
// its vCPU, memory and process limits. It handles both hierarchies: v2
// (unified) and v1 (one tree per controller, as on this project's CI
// machines).
type cgroups struct {
	v2   bool
	root string // v2: the unified mount; v1: the directory holding the controllers
}

// Limits of one QEMU process.
type cgLimits struct {
	CPUs     int   // quota in whole CPUs
	MemBytes int64 // RSS of the whole process, guest memory included
	Pids     int   // QEMU's threads
}

func detectCgroups(root string) (*cgroups, error) {
	if root == "" {
		root = "/sys/fs/cgroup"
	}
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return &cgroups{v2: true, root: root}, nil
	}
	for _, c := range []string{"cpu", "memory", "pids"} {
		if _, err := os.Stat(filepath.Join(root, c)); err != nil {
			return nil, fmt.Errorf("cgroup v1 controller %s: %w", c, err)
		}
	}
	return &cgroups{root: root}, nil
}

// dirs returns the cgroup directories of id (one for v2, one per
// controller for v1).
func (c *cgroups) dirs(id string) []string {
	if c.v2 {
		return []string{filepath.Join(c.root, "warren", id)}
	}
	var ds []string
	for _, ctl := range []string{"cpu", "memory", "pids"} {
		ds = append(ds, filepath.Join(c.root, ctl, "warren", id))
	}
	return ds
}

func write(path, v string) error {
	if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	return nil
}

// create makes id's cgroups with their limits and returns the cgroup.procs
// files a process joins by writing its pid.
func (c *cgroups) create(id string, l cgLimits) ([]string, error) {
	var procs []string
	if c.v2 {
		parent := filepath.Join(c.root, "warren")
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return nil, err
		}
		_ = write(filepath.Join(c.root, "cgroup.subtree_control"), "+cpu +memory +pids")
		if err := write(filepath.Join(parent, "cgroup.subtree_control"), "+cpu +memory +pids"); err != nil {
			return nil, err
		}
		d := filepath.Join(parent, id)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		errs := errors.Join(
			write(filepath.Join(d, "cpu.max"), fmt.Sprintf("%d 100000", l.CPUs*100000)),
			write(filepath.Join(d, "memory.max"), strconv.FormatInt(l.MemBytes, 10)),
			write(filepath.Join(d, "pids.max"), strconv.Itoa(l.Pids)))
		if errs != nil {
			c.remove(id)
			return nil, errs
		}
		return []string{filepath.Join(d, "cgroup.procs")}, nil
	}
	ds := c.dirs(id)
	for _, d := range ds {
		if err := os.MkdirAll(d, 0o755); err != nil {
			c.remove(id)
			return nil, err
		}
		procs = append(procs, filepath.Join(d, "cgroup.procs"))
	}
	errs := errors.Join(
		write(filepath.Join(ds[0], "cpu.cfs_period_us"), "100000"),
		write(filepath.Join(ds[0], "cpu.cfs_quota_us"), strconv.Itoa(l.CPUs*100000)),
		write(filepath.Join(ds[1], "memory.limit_in_bytes"), strconv.FormatInt(l.MemBytes, 10)),
		write(filepath.Join(ds[2], "pids.max"), strconv.Itoa(l.Pids)))
	if errs != nil {
		c.remove(id)
		return nil, errs
	}
	return procs, nil
}

// setLow gives id's QEMU a small CPU weight (a warm-pool member being
// made) or the normal one (a claimed sandbox), so refilling a pool does not
// take CPU from sandboxes in use.
func (c *cgroups) setLow(id string, low bool) error {
	if c.v2 {
		w := "100"
		if low {
			w = "10"
		}
		return write(filepath.Join(c.root, "warren", id, "cpu.weight"), w)
	}
	w := "1024"
	if low {
		w = "64"
	}
	return write(filepath.Join(c.root, "cpu", "warren", id, "cpu.shares"), w)
}

// remove deletes id's cgroups; their processes must have exited. It
// retries briefly: the kernel frees a cgroup a moment after its last task.
func (c *cgroups) remove(id string) error {
	var last error
	for _, d := range c.dirs(id) {
		for i := 0; i < 50; i++ {
			err := os.Remove(d)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				last = nil
				break
			}
			last = err
			time.Sleep(10 * time.Millisecond)
		}
	}
	return last
}

// list returns the ids that have a cgroup.
func (c *cgroups) list() []string {
	parent := filepath.Join(c.root, "warren")
	if !c.v2 {
		parent = filepath.Join(c.root, "memory", "warren")
	}
	ents, _ := os.ReadDir(parent)
	var ids []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	return ids
}
