package microvm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/internal/atomicfile"
	"github.com/warrenhq/warren/netpolicy"
	"github.com/warrenhq/warren/noded/driver"
)

// A snapshot is a template booted, warmed up and saved: its memory file
// (mapped by clones copy-on-write), its device state, and its root disk
// overlay (the backing file of every clone's overlay).
type snapshot struct {
	Dir  string
	Meta snapMeta
}

type snapMeta struct {
	Template        string `json:"template"`
	TemplateVersion string `json:"template_version"`
	KernelSHA256    string `json:"kernel_sha256"`
	QEMUVersion     string `json:"qemu_version"`
	Accel           string `json:"accelerator"`
	MemMB           int    `json:"mem_mb"`
	VCPUs           int    `json:"vcpus"`
	Cmdline         string `json:"cmdline"`
	CPU             string `json:"cpu,omitempty"`
	NIC             bool   `json:"nic"`
	// NICUp: the snapshot's guest brought its NIC up before it was saved.
	// Snapshots made before that are remade.
	NICUp bool `json:"nic_up"`
	// GuestNet is the network settings (guest.NetConfig as JSON) the
	// snapshot's guest set before it was saved: those of every microVM
	// sandbox of the node's egress policy (driver.TapGuest). A claim that
	// sets the same ones finds them in place. Empty: the NIC is up
	// without addresses (no egress policy).
	GuestNet string `json:"guest_net,omitempty"`
	// Rootfs identifies the template's root file system as the snapshot
	// found it (rootfsID): the snapshot's memory holds the guest's view
	// of that disk (its page cache, ext4's state), and its clones' disks
	// are overlays on it, so a file changed in place since (a loop mount,
	// tune2fs, an image of the same size copied over it) must not be
	// restored onto. Snapshots from before it are made again.
	Rootfs string `json:"rootfs,omitempty"`
	// AgentWire: the snapshot's agent said it reads the wire codec
	// (guest.Result.Wire), so its clones' hosts use it from their first
	// call: a clone's first calls then run no JSON decoding, which under
	// TCG each fresh clone would translate. Learnt, not wanted: a
	// snapshot without it is used as it is, its clones speaking JSON.
	AgentWire bool   `json:"agent_wire,omitempty"`
	Created   string `json:"created"`
	TookMS    int64  `json:"took_ms"`
}

func (s *snapshot) mem() string   { return filepath.Join(s.Dir, "mem") }
func (s *snapshot) state() string { return filepath.Join(s.Dir, "state") }
func (s *snapshot) disk() string  { return filepath.Join(s.Dir, "disk.qcow2") }

// snapshotDir is where t's snapshot for these settings lives: its name
// ends in a hash of everything loadSnapshot checks (wantMeta), so a
// snapshot made again for other settings (a new QEMU, kernel command line,
// CPU model or network) goes into a directory of its own. The one it
// replaces stays while a clone's overlay names its disk as the backing
// file (a paused clone reopens it on resume), and pruneSnapshots removes
// it after.
func (d *Driver) snapshotDir(t *guest.Template) string {
	b, _ := json.Marshal(d.wantMeta(t))
	h := sha256.Sum256(b)
	return filepath.Join(d.cfg.StateDir, "snapshots", snapshotBase(t, d.cfg.SnapshotMemMB, d.accel)+"-"+hex.EncodeToString(h[:6]))
}

// snapshotBase is the part of a snapshot directory's name that every
// snapshot of t's version for these settings shares.
func snapshotBase(t *guest.Template, memMB int, accel string) string {
	return fmt.Sprintf("%s-%s-%dm-%s", t.Name, t.Version, memMB, accel)
}

// pruneSnapshots removes the snapshots that a newer one of the same
// template version replaced, or that are of a version of a template other
// than the ones loaded (once one of those has its snapshot), and that no
// VM's overlay (a clone's root disk) still names as its backing file, and
// the blank overlays of snapshots that are gone. A snapshot is matched to its template by its meta.json
// (names may share a prefix: web-1@2 and web@1-2). It returns how many it
// removed.
func (d *Driver) pruneSnapshots() int {
	type key struct {
		name, version string
		memMB         int
		accel         string
	}
	current := map[key]string{} // the current snapshot's directory
	// The versions of each template loaded, and whether one of them has
	// its snapshot: a snapshot of a version not loaded beside one that is
	// (a template rebuilt, the node restarted) is an old version's.
	loaded := map[string]map[string]bool{}
	hasSnap := map[string]bool{}
	d.mu.Lock()
	for _, ts := range d.templates {
		if loaded[ts.t.Name] == nil {
			loaded[ts.t.Name] = map[string]bool{}
		}
		loaded[ts.t.Name][ts.t.Version] = true
		if ts.snap != nil {
			current[key{ts.t.Name, ts.t.Version, d.cfg.SnapshotMemMB, d.accel}] = ts.snap.Dir
			hasSnap[ts.t.Name] = true
		}
	}
	d.mu.Unlock()
	if len(current) == 0 {
		return 0
	}
	used := map[string]bool{}
	vms, _ := filepath.Glob(filepath.Join(d.cfg.StateDir, "vms", "*", "disk.qcow2"))
	for _, disk := range vms {
		if b, err := backingFile(disk); err == nil && b != "" {
			used[filepath.Dir(b)] = true
		}
	}
	root := filepath.Join(d.cfg.StateDir, "snapshots")
	ents, _ := os.ReadDir(root)
	n := 0
	for _, e := range ents {
		dir := filepath.Join(root, e.Name())
		if e.IsDir() && strings.Contains(e.Name(), ".tmp-") {
			// One being made stays; any other is a node's that stopped
			// while making it (its memory file up to the snapshot's
			// size): nothing else removes it.
			d.mu.Lock()
			making := d.making[dir]
			d.mu.Unlock()
			if !making {
				d.log.Info("removing an unfinished snapshot", "snapshot", dir)
				_ = os.RemoveAll(dir)
				n++
			}
			continue
		}
		if !e.IsDir() || used[dir] {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
		var m snapMeta
		if err != nil || json.Unmarshal(b, &m) != nil {
			continue // not a snapshot this can tell apart: leave it
		}
		if hasSnap[m.Template] && !loaded[m.Template][m.TemplateVersion] {
			// Nothing removed these: every rebuild of a template left a
			// memory file and a disk per node for good.
			d.log.Info("removing an older template version's snapshot no sandbox uses", "snapshot", dir, "template", m.Template+"@"+m.TemplateVersion)
			_ = os.RemoveAll(dir)
			n++
			continue
		}
		cur, ok := current[key{m.Template, m.TemplateVersion, m.MemMB, m.Accel}]
		if !ok || cur == dir {
			continue
		}
		d.log.Info("removing a replaced snapshot no sandbox uses", "snapshot", dir, "current", cur)
		_ = os.RemoveAll(dir)
		n++
	}
	blanks, _ := filepath.Glob(filepath.Join(d.blanks.dir, "*.qcow2"))
	for _, bl := range blanks {
		if b, err := backingFile(bl); err == nil && b != "" {
			if _, err := os.Stat(b); os.IsNotExist(err) {
				_ = os.Remove(bl)
				n++
			}
		}
	}
	return n
}

func (d *Driver) wantMeta(t *guest.Template) snapMeta {
	return snapMeta{Template: t.Name, TemplateVersion: t.Version, KernelSHA256: kernelSHA256(t, 1), QEMUVersion: d.qver,
		Accel: d.accel, MemMB: d.cfg.SnapshotMemMB, VCPUs: 1, Cmdline: d.cmdline(""), CPU: d.cpu(), NIC: true, NICUp: true, GuestNet: d.snapshotNet(),
		Rootfs: rootfsID(t)}
}

// rootfsID identifies t's root file system by what a change to it in
// place changes: its size, modification and change times, and inode (a
// change time cannot be set back by a file's owner). Hashing it instead
// would read gigabytes at every start. "" if it cannot be read.
func rootfsID(t *guest.Template) string {
	if t.Rootfs.File == "" {
		return ""
	}
	var st syscall.Stat_t
	if err := syscall.Stat(t.Path(t.Rootfs), &st); err != nil {
		return ""
	}
	return fmt.Sprintf("%d bytes, modified %d.%09d, changed %d.%09d, inode %d",
		st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec, st.Ino)
}

// snapshotNet is snapMeta.GuestNet for this node's networks.
func (d *Driver) snapshotNet() string {
	tg, ok := d.cfg.Networks.(driver.TapGuest)
	if !ok {
		return ""
	}
	b, _ := json.Marshal(tg.TapGuestConfig())
	return string(b)
}

// loadSnapshot returns t's snapshot if one exists and matches this node's
// template, QEMU and accelerator; otherwise the reason it cannot be used.
func (d *Driver) loadSnapshot(t *guest.Template) (*snapshot, error) {
	dir := d.snapshotDir(t)
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		// The directory's name hashes the settings: after a change (a
		// QEMU upgrade, another command line) the last snapshot is in
		// another one. Say what changed, from that one.
		if prev, ok := d.lastSnapshotMeta(t); ok {
			if diff := metaDiff(prev, d.wantMeta(t)); diff != "" {
				return nil, fmt.Errorf("no snapshot of %s@%s for this node's settings yet: the last one was made with %s", t.Name, t.Version, diff)
			}
		}
		return nil, fmt.Errorf("no snapshot of %s@%s yet", t.Name, t.Version)
	}
	s := &snapshot{Dir: dir}
	if err := json.Unmarshal(b, &s.Meta); err != nil {
		return nil, fmt.Errorf("snapshot meta: %w", err)
	}
	want := d.wantMeta(t)
	got := s.Meta
	got.Created, got.TookMS, got.AgentWire = "", 0, false
	if got != want {
		return nil, fmt.Errorf("snapshot %s does not match: it was made with %s", dir, metaDiff(got, want))
	}
	for _, f := range []string{s.mem(), s.state(), s.disk()} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
	}
	return s, nil
}

// lastSnapshotMeta returns the meta of the newest snapshot of t's
// version in the state directory, whatever its settings.
func (d *Driver) lastSnapshotMeta(t *guest.Template) (snapMeta, bool) {
	dirs, _ := filepath.Glob(filepath.Join(d.cfg.StateDir, "snapshots", t.Name+"-"+t.Version+"-*"))
	var last snapMeta
	var lastMod time.Time
	for _, dir := range dirs {
		if strings.Contains(filepath.Base(dir), ".tmp-") {
			continue
		}
		f := filepath.Join(dir, "meta.json")
		fi, err := os.Stat(f)
		if err != nil || !fi.ModTime().After(lastMod) {
			continue
		}
		b, err := os.ReadFile(f)
		var m snapMeta
		// Names may share a prefix (web-1@2 and web@1-2): the meta says.
		if err != nil || json.Unmarshal(b, &m) != nil || m.Template != t.Name || m.TemplateVersion != t.Version {
			continue
		}
		last, lastMod = m, fi.ModTime()
	}
	return last, !lastMod.IsZero()
}

// metaDiff names the settings (meta.json's fields, but what a snapshot
// learns or records of its making) in which a snapshot made with has
// differs from want, with both values.
func metaDiff(has, want snapMeta) string {
	fields := func(m snapMeta) map[string]string {
		b, _ := json.Marshal(m)
		var f map[string]any
		_ = json.Unmarshal(b, &f)
		s := map[string]string{}
		for k, v := range f {
			s[k] = fmt.Sprint(v)
		}
		return s
	}
	h, w := fields(has), fields(want)
	keys := map[string]bool{}
	for k := range h {
		keys[k] = true
	}
	for k := range w {
		keys[k] = true
	}
	var diffs []string
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if k == "created" || k == "took_ms" || k == "agent_wire" {
			continue
		}
		if h[k] != w[k] { // a field left out (omitempty) is ""
			diffs = append(diffs, fmt.Sprintf("%s %q, this node has %q", k, h[k], w[k]))
		}
	}
	return strings.Join(diffs, "; ")
}

// makeSnapshot boots t with its memory in a shared file, warms it up,
// disconnects from the agent (so a clone's agent waits for a new host),
// and saves the device state next to the memory file. The guest memory
// itself is not copied: with x-ignore-shared, the file is the memory.
func (d *Driver) makeSnapshot(ctx context.Context, t *guest.Template) (*snapshot, error) {
	t0 := time.Now()
	final := d.snapshotDir(t)
	tmp := final + ".tmp-" + randID()
	d.mu.Lock()
	if d.making == nil {
		d.making = map[string]bool{}
	}
	d.making[tmp] = true
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.making, tmp)
		d.mu.Unlock()
	}()
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	s := &snapshot{Dir: tmp}
	if err := createOverlay(ctx, t.Path(t.Rootfs), "raw", s.disk()); err != nil {
		return nil, err
	}
	m := d.wantMeta(t)
	id := d.newVMID()
	spec := vmSpec{ID: id, Dir: d.vmDir(id), Kernel: kernelPath(t, m.VCPUs), Initramfs: t.Path(t.Initramfs),
		Disk: s.disk(), MemMB: m.MemMB, VCPUs: m.VCPUs, MemFile: s.mem(), MemShare: true, Accel: d.accel, Cmdline: m.Cmdline, CPU: m.CPU, TBSizeMB: d.cfg.TCGCacheMB, NIC: m.NIC}
	d.track(id, true)
	defer d.track(id, false)
	// The boot's sockets and logs go whether the snapshot is made or not
	// (this runs after the QEMU is killed below).
	defer os.RemoveAll(spec.Dir)
	p, err := start(d.cfg.QEMU, spec, nil, nil, "")
	if err != nil {
		return nil, err
	}
	defer p.kill()
	bctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	q, err := DialQMP(bctx, spec.qmpPath())
	if err != nil {
		return nil, err
	}
	defer q.Close()
	c, err := waitAgent(bctx, spec, p.exited, bootAgentWait, d.log)
	if err != nil {
		return nil, err
	}
	// Warm-up: the first commands fault in the shell, libc and the page
	// cache, so every clone starts with them in memory.
	for _, argv := range [][]string{{"true"}, {"sh", "-c", "ls / >/dev/null; uname -a >/dev/null; echo $((6*7)) >/dev/null"}} {
		if _, _, err := c.Output(bctx, argv...); err != nil {
			c.Close()
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	// The guest's network is set up in the snapshot: the NIC up, and
	// with the node's egress policy the addresses, routes and resolver
	// every microVM sandbox of this node gets. The agent remembers
	// them, so a clone's claim, which sends the same, changes nothing.
	// Under TCG every clone translates afresh the code it runs, and
	// setting the network took a restored clone 260-280 ms, most of it
	// that (bench/README.md, twenty-third session).
	nc := guest.NetConfig{Iface: netpolicy.IfaceUplink}
	if m.GuestNet != "" {
		if err := json.Unmarshal([]byte(m.GuestNet), &nc); err != nil {
			c.Close()
			return nil, fmt.Errorf("warm-up: network: %w", err)
		}
	}
	// The default process limit too: setting it took a clone 14-19 ms.
	if _, err := c.Claim(bctx, guest.ClaimRequest{Now: time.Now(), Net: &nc, Pids: DefaultPids}); err != nil {
		c.Close()
		return nil, fmt.Errorf("warm-up: claim: %w", err)
	}
	// The kernel finishes bringing the link up in the background (its
	// link watch runs up to a second after the interface is set up, and
	// only then configures IPv6 on it); a snapshot saved before that
	// left the work to every clone's claim: about 1,600 blocks of network
	// code translated afresh in each (bench/README.md, twenty-fourth
	// session). With the agent's quiet IPv6 settings nothing is pending
	// once the link is ready.
	if err := waitLinkReady(bctx, c, nc.Iface, linkReadyWait); err != nil {
		d.log.Warn("snapshot: the guest's link is not ready; saving it anyway", "template", t.Name, "err", err)
	}
	if err := c.Sync(bctx); err != nil {
		c.Close()
		return nil, err
	}
	m.AgentWire = c.Wire()
	c.Close()
	// The guest sees the host hang up and goes back to waiting for one;
	// give it a moment, then freeze it.
	time.Sleep(hangUpGrace)
	if _, err := q.Run(bctx, "stop", nil); err != nil {
		return nil, err
	}
	if err := saveState(bctx, q, s.state(), 0o644, true); err != nil {
		return nil, err
	}
	_, _ = q.Run(bctx, "quit", nil)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
	}
	// Durable before it is named: every clone restores the snapshot, so a
	// power loss must not leave one whose memory or disk lost writes (the
	// state file saveState synced). The memory file holds what the guest
	// wrote through its shared mapping; QEMU has quit, so its pages are
	// all in the page cache now.
	for _, f := range []string{s.mem(), s.disk()} {
		if err := durable(f); err != nil {
			return nil, fmt.Errorf("snapshot: sync %s: %w", filepath.Base(f), err)
		}
	}
	m.Created = time.Now().UTC().Format(time.RFC3339)
	m.TookMS = time.Since(t0).Milliseconds()
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := atomicfile.WriteFile(filepath.Join(tmp, "meta.json"), b, 0o644); err != nil {
		return nil, err
	}
	os.RemoveAll(final)
	if err := os.Rename(tmp, final); err != nil {
		return nil, err
	}
	if err := durable(final); err != nil { // and its name, in the template's directory
		os.RemoveAll(final)
		return nil, fmt.Errorf("snapshot: sync: %w", err)
	}
	s.Dir, s.Meta = final, m
	return s, nil
}

// linkReadyWait bounds makeSnapshot's wait for the guest's link.
const linkReadyWait = 5 * time.Second

// waitLinkReady waits until the guest's iface is operationally up and,
// where the guest kernel has IPv6, has a link-local address that is no
// longer tentative: the kernel's set-up of the link is done.
func waitLinkReady(ctx context.Context, c *guest.Client, iface string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last string
	for {
		ready, why, err := linkReady(ctx, c, iface)
		if err != nil {
			return err
		}
		if ready {
			return nil
		}
		last = why
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s after %v: %s", iface, limit, last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// linkReady reads the guest's operstate and IPv6 addresses of iface (see
// waitLinkReady); why says what is missing.
func linkReady(ctx context.Context, c *guest.Client, iface string) (ready bool, why string, err error) {
	var op bytes.Buffer
	if _, err := c.ReadFile(ctx, "/sys/class/net/"+iface+"/operstate", 64<<10, &op); err != nil {
		return false, "", fmt.Errorf("operstate: %w", err)
	}
	if st := strings.TrimSpace(op.String()); st != "up" {
		return false, "operstate " + st, nil
	}
	var a6 bytes.Buffer
	if _, err := c.ReadFile(ctx, "/proc/net/if_inet6", 64<<10, &a6); err != nil {
		return true, "", nil // no IPv6 in this kernel
	}
	ok, why := linkLocalReady(a6.String(), iface)
	return ok, why, nil
}

// ifaTentative is IFA_F_TENTATIVE, an address's flag in /proc/net/if_inet6.
const ifaTentative = 0x40

// linkLocalReady reports whether /proc/net/if_inet6 (text) has a
// link-local address of iface that is not tentative.
func linkLocalReady(text, iface string) (bool, string) {
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		// address, ifindex, prefix length, scope, flags, name (hex but
		// the name)
		if len(f) != 6 || f[5] != iface || !strings.HasPrefix(f[0], "fe80") {
			continue
		}
		flags, err := strconv.ParseUint(f[4], 16, 32)
		if err != nil {
			continue
		}
		if flags&ifaTentative != 0 {
			return false, "link-local address tentative"
		}
		return true, ""
	}
	return false, "no link-local address yet"
}

// hangUpGrace is how long a running guest is given to notice the host's
// hang-up and end its agent session: before the template's snapshot
// freezes it, so the saved state holds no session the next host does not
// know of, and before a resumed VM's host connects again (freshSession).
const hangUpGrace = 300 * time.Millisecond

// saveState migrates a stopped VM's device state (and, unless its memory
// is a shared file and ignoreShared is set, its memory) into path, made
// with mode perm, and returns once path and its name are on disk. The
// node opens the file and hands it to QEMU, which may not start a process
// (such as the `exec:cat > path` this took before) or open a file itself
// once it runs (seccompArgs).
//
// QEMU's own writes are not synced: what it wrote through the descriptor
// sits in the page cache, and a power loss soon after a pause left a
// paused.state cut short, which no resume can load. (The root disk's
// overlay needs nothing more: the migration's end stops the VM with
// vm_stop_force_state, which drains and flushes every block device,
// fdatasync under the drive's default writeback cache, and fails the
// migration if the flush fails.)
func saveState(ctx context.Context, q *QMP, path string, perm os.FileMode, ignoreShared bool) error {
	if _, err := q.Run(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": ignoreShared}},
	}); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	// QEMU keeps its own copy of the descriptor until the migration ends.
	err = q.SendFD(ctx, "state", f)
	f.Close()
	if err != nil {
		return err
	}
	if _, err := q.Run(ctx, "migrate", map[string]any{"uri": "fd:state"}); err != nil {
		_, _ = q.Run(ctx, "closefd", map[string]any{"fdname": "state"})
		return err
	}
	for {
		st, desc, err := q.Migration(ctx)
		if err != nil {
			return err
		}
		switch st {
		case "completed":
			if err := durable(path); err != nil {
				return fmt.Errorf("save state: sync: %w", err)
			}
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("save state: migration %s: %s", st, desc)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// durable makes a file (or directory) and its name durable
// (atomicfile.Sync). A variable so tests can see the syncs of a pause.
var durable = atomicfile.Sync

// loadState restores device state (and memory) from uri (the spec's
// incomingURI) into a QEMU started with -incoming defer, and waits until it
// is loaded (paused).
func loadState(ctx context.Context, q *QMP, uri string, ignoreShared bool) error {
	if _, err := q.Run(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": ignoreShared}},
	}); err != nil {
		return err
	}
	if _, err := q.Run(ctx, "migrate-incoming", map[string]any{"uri": uri}); err != nil {
		return err
	}
	for {
		st, err := q.Status(ctx)
		if err != nil {
			return err
		}
		switch st {
		case "paused", "running", "postmigrate":
			return nil
		case "inmigrate", "prelaunch":
		default:
			return fmt.Errorf("load state: VM is %s", st)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}
