package image

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/internal/atomicfile"
)

// DefaultPackages are installed in the "default" template's root file
// system on top of debootstrap's minbase.
var DefaultPackages = []string{
	"git", "ca-certificates", "coreutils", "procps", "iproute2", "ripgrep", "python3", "golang-go", "make",
}

// Config is one build.
type Config struct {
	Name   string // template name, e.g. "default"
	Out    string // template store root
	Kernel string // a vmlinuz; "" picks the newest /boot/vmlinuz-*
	// Modules is the kernel's modules directory (modules.dep, and
	// modules.builtin for drivers built in); "" is
	// /lib/modules/RELEASE, RELEASE from the kernel's file name
	// (vmlinuz-RELEASE).
	Modules string
	// KernelUP is an optional uniprocessor build of the kernel (a
	// vmlinuz-RELEASE, CONFIG_SMP off) for one-vCPU guests, and
	// ModulesUP its modules directory (the same default as Modules).
	// Both kernels must have every guest driver built in: the initramfs
	// carries one set of modules.
	KernelUP  string
	ModulesUP string
	Agent     string   // the static warren-guest binary
	Suite     string   // Debian suite for debootstrap
	Mirror    string   // Debian mirror
	Packages  []string // extra packages
	// FreeMB is the free space left in the root file system: the most a
	// sandbox can write to its disk.
	FreeMB int
	// Smoke boots the result once and records the accelerator and boot time.
	Smoke func(ctx context.Context, t *guest.Template) (accel string, boot time.Duration, err error)
	// QEMUVersion is recorded in the manifest.
	QEMUVersion string
	// Keep is how many versions of the template stay in the store, the new
	// one included (older ones are removed; sandboxes restored from them
	// keep their open files, but cannot be paused and resumed). The
	// version current pointed to before the build always stays: see prune.
	Keep     int
	Progress io.Writer
}

func (c *Config) validate() error {
	var errs []error
	// The servers refuse any other name in a node's list of templates,
	// a task, a pool or a sandbox: a template named otherwise could never
	// be used, and kept every node that advertised it out of the cluster.
	if !api.TemplateNameRE.MatchString(c.Name) {
		errs = append(errs, fmt.Errorf("name %q: %s", c.Name, api.TemplateNameRule))
	}
	if c.Out == "" {
		errs = append(errs, errors.New("out: required"))
	}
	if c.Agent == "" {
		errs = append(errs, errors.New("agent: required (the static warren-guest binary)"))
	} else if _, err := os.Stat(c.Agent); err != nil {
		errs = append(errs, fmt.Errorf("agent: %w (build it with `make bin/warren-guest`)", err))
	}
	if c.FreeMB < 64 || c.FreeMB > 1<<20 {
		errs = append(errs, fmt.Errorf("free-mb %d: must be between 64 and 1048576", c.FreeMB))
	}
	for _, tool := range []string{"debootstrap", "mkfs.ext4", "xz"} {
		if _, err := exec.LookPath(tool); err != nil {
			errs = append(errs, fmt.Errorf("%s: not installed (apt-get install debootstrap e2fsprogs xz-utils)", tool))
		}
	}
	return errors.Join(errs...)
}

func (c *Config) step(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "image: "+format+"\n", args...)
	}
}

// Build makes a template and points <out>/<name>/current at it.
func Build(ctx context.Context, c Config) (*guest.Template, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	start := time.Now()
	if c.Kernel == "" {
		ks, _ := filepath.Glob("/boot/vmlinuz-*")
		if len(ks) == 0 {
			return nil, errors.New("kernel: no /boot/vmlinuz-* (apt-get install linux-image-amd64)")
		}
		c.Kernel = newestKernel(ks)
	}
	release, modDir, err := kernelModules(c.Kernel, c.Modules)
	if err != nil {
		return nil, err
	}
	var upRelease string
	if c.KernelUP != "" {
		var upModDir string
		if upRelease, upModDir, err = kernelModules(c.KernelUP, c.ModulesUP); err != nil {
			return nil, fmt.Errorf("kernel-up: %w", err)
		}
		if err := allBuiltIn(modDir, upModDir); err != nil {
			return nil, fmt.Errorf("kernel-up: %w", err)
		}
	}
	root, buildDir := filepath.Join(c.Out, c.Name), buildDirOf(c.Out, c.Name)
	unlock, err := lockBuild(c.Name, buildDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	removeOldBuildDir(root + "-build")
	work, err := os.MkdirTemp(buildDir, "")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	c.step("[1/5] kernel: uncompressing %s", c.Kernel)
	if err := extractVmlinux(c.Kernel, filepath.Join(work, "vmlinux")); err != nil {
		return nil, err
	}
	if c.KernelUP != "" {
		c.step("      and the uniprocessor build for one-vCPU guests, %s", c.KernelUP)
		if err := extractVmlinux(c.KernelUP, filepath.Join(work, "vmlinux-up")); err != nil {
			return nil, fmt.Errorf("kernel-up: %w", err)
		}
	}
	c.step("[2/5] initramfs: warren-guest and, of the %d guest modules, those %s does not have built in", len(GuestModules), modDir)
	if err := buildInitramfs(c.Agent, modDir, filepath.Join(work, "initramfs.cpio")); err != nil {
		return nil, err
	}
	pkgs := append(append([]string(nil), DefaultPackages...), c.Packages...)
	c.step("[3/5] rootfs: debootstrap %s with %s (this takes a few minutes)", c.Suite, strings.Join(pkgs, ","))
	rootDir := filepath.Join(c.Out, ".cache", c.Name+"-rootfs-"+shortHash(c.Suite+c.Mirror+strings.Join(pkgs, ",")))
	if err := debootstrap(ctx, c, pkgs, rootDir); err != nil {
		return nil, err
	}
	c.step("[4/5] rootfs: mkfs.ext4 with %d MiB free", c.FreeMB)
	fsBytes, err := mkfs(ctx, c, c.Agent, rootDir, filepath.Join(work, "rootfs.ext4"))
	if err != nil {
		return nil, err
	}
	pruneRootfsCache(c.Out, c.Name, rootDir)
	m := guest.Manifest{Name: c.Name, Created: time.Now().UTC().Format(time.RFC3339), KernelRelease: release,
		QEMUVersion: c.QEMUVersion, Packages: pkgs, Suite: c.Suite, DiskBytes: fsBytes}
	type output struct {
		dst  *guest.Artifact
		file string
	}
	files := []output{{&m.Kernel, "vmlinux"}, {&m.Initramfs, "initramfs.cpio"}, {&m.Rootfs, "rootfs.ext4"}}
	if c.KernelUP != "" {
		m.KernelUP, m.KernelUPRelease = &guest.Artifact{}, upRelease
		files = append(files, output{m.KernelUP, "vmlinux-up"})
	}
	for _, a := range files {
		sum, n, err := guest.FileSHA256(filepath.Join(work, a.file))
		if err != nil {
			return nil, err
		}
		*a.dst = guest.Artifact{File: a.file, SHA256: sum, Size: n}
	}
	if sum, n, err := guest.FileSHA256(c.Agent); err == nil {
		m.Agent = guest.Artifact{File: "initramfs.cpio:/init", SHA256: sum, Size: n}
	}
	sums := m.Kernel.SHA256 + m.Initramfs.SHA256 + m.Rootfs.SHA256
	if m.KernelUP != nil {
		sums += m.KernelUP.SHA256
	}
	m.Version = shortHash(sums)
	final := filepath.Join(root, m.Version)
	if err := writeManifest(work, &m); err != nil {
		return nil, err
	}
	if err := os.Chmod(work, 0o755); err != nil {
		return nil, err
	}
	// The smoke boot runs in the work directory: a version enters the
	// store only once it booted (or with --no-smoke), so one that failed
	// or was interrupted is never among those --keep keeps.
	t := &guest.Template{Dir: work, Manifest: m}
	if c.Smoke != nil {
		if m.KernelUP != nil {
			c.step("[5/5] smoke boot: one vCPU on the uniprocessor kernel, then two on the SMP kernel")
		} else {
			c.step("[5/5] smoke boot")
		}
		accel, boot, err := c.Smoke(ctx, t)
		if err != nil {
			// Kept to look into, until the next build starts.
			failed := filepath.Join(buildDir, "failed-"+m.Version)
			if os.Rename(work, failed) != nil {
				failed = work
			}
			return nil, fmt.Errorf("smoke boot of %s: %w (the template is in %s until the next build)", m.Version, err, failed)
		}
		t.Accelerator, t.BootMS = accel, boot.Milliseconds()
		if err := writeManifest(work, &t.Manifest); err != nil {
			return nil, err
		}
		c.step("      booted on %s in %v", accel, boot.Round(time.Millisecond))
	}
	if _, err := os.Stat(final); err == nil {
		os.RemoveAll(final) // the same content: replace it whole
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	if err := os.Rename(work, final); err != nil {
		return nil, err
	}
	t.Dir = final
	// The version current names until the swap below: nodes running now
	// may have loaded it (a node keeps the version it loaded until it
	// restarts), so prune spares it.
	previous, _ := os.Readlink(filepath.Join(root, "current"))
	tmpLink := filepath.Join(root, ".current-"+m.Version)
	_ = os.Remove(tmpLink)
	if err := os.Symlink(m.Version, tmpLink); err != nil {
		return nil, err
	}
	if err := os.Rename(tmpLink, filepath.Join(root, "current")); err != nil {
		return nil, err
	}
	if c.Keep > 0 {
		for _, old := range prune(root, m.Version, previous, c.Keep) {
			c.step("      removed old version %s", old)
		}
	}
	c.step("done: %s@%s in %s (%v)", c.Name, m.Version, final, time.Since(start).Round(time.Second))
	return t, nil
}

// newestKernel returns the vmlinuz-RELEASE of paths with the highest
// release, comparing the releases' numbers as numbers: 6.1.0-57 is newer
// than 6.1.0-9.
func newestKernel(paths []string) string {
	best := paths[0]
	for _, p := range paths[1:] {
		if compareVersions(filepath.Base(p), filepath.Base(best)) > 0 {
			best = p
		}
	}
	return best
}

// compareVersions compares a and b run by run, a run being digits or
// other characters: digit runs as numbers, others as strings.
func compareVersions(a, b string) int {
	for a != "" && b != "" {
		ra, rb := versionRun(a), versionRun(b)
		a, b = a[len(ra):], b[len(rb):]
		if isDigit(ra[0]) && isDigit(rb[0]) {
			na, nb := strings.TrimLeft(ra, "0"), strings.TrimLeft(rb, "0")
			if c := cmp.Compare(len(na), len(nb)); c != 0 {
				return c
			}
			ra, rb = na, nb
		}
		if c := strings.Compare(ra, rb); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}

// versionRun is the run of digits or of other characters s starts with.
func versionRun(s string) string {
	i := 1
	for i < len(s) && isDigit(s[i]) == isDigit(s[0]) {
		i++
	}
	return s[:i]
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// buildDirOf is the directory of template name's builds in the store out:
// its lock, the work directory of the build that holds it, what earlier
// builds left. It is under out/.build, where no template can be (a
// template's name does not start with a dot). Before, it was
// out/<name>-build, which is also the template named "<name>-build": a
// build of "py" emptied the template "py-build".
func buildDirOf(out, name string) string {
	return filepath.Join(out, ".build", name)
}

// removeOldBuildDir removes dir, a template's build directory from before
// buildDirOf (out/<name>-build), if it is one: it has a build's .lock and
// no current, which the template of that name would have, and no build
// of an older warren holds the lock. Anything else is left alone.
func removeOldBuildDir(dir string) {
	if _, err := os.Lstat(filepath.Join(dir, "current")); !errors.Is(err, fs.ErrNotExist) {
		return // a template (or what cannot be looked at)
	}
	f, err := os.Open(filepath.Join(dir, ".lock"))
	if err != nil {
		return
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return
	}
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return // an older warren's build runs in it
	}
	_ = os.RemoveAll(dir)
}

// lockBuild takes the lock of a template's build directory, dir, so that
// one build of the template runs at a time, and removes what earlier
// builds left in it: the work directory of one that was killed (SIGKILL,
// the OOM killer, CI's time limit: no deferred call ran) holds the whole
// template, 2 GB for the default one; and the version of one whose smoke
// boot failed was kept there to look into. The lock ends with the
// process, however it ends. unlock releases it.
func lockBuild(name, dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, ".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another build of template %s is running (it holds %s)", name, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != ".lock" {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	return func() { f.Close() }, nil
}

// kernelModules returns a vmlinuz-RELEASE's release and its modules
// directory: modDir, or /lib/modules/RELEASE when that is "".
func kernelModules(kernel, modDir string) (string, string, error) {
	release := strings.TrimPrefix(filepath.Base(kernel), "vmlinuz-")
	if _, err := os.Stat(kernel); err != nil {
		return "", "", fmt.Errorf("kernel: %w", err)
	}
	if modDir == "" {
		modDir = filepath.Join("/lib/modules", release)
	}
	if _, err := os.Stat(modDir); err != nil {
		return "", "", fmt.Errorf("kernel %s: modules: %w", kernel, err)
	}
	return release, modDir, nil
}

// allBuiltIn checks that the kernels of these modules directories need
// no module of GuestModules loaded: the initramfs carries the modules of
// one kernel, so a template with two kernels needs none.
func allBuiltIn(modDirs ...string) error {
	for _, d := range modDirs {
		mods, err := moduleOrder(d, GuestModules)
		if err != nil {
			return err
		}
		if len(mods) > 0 {
			return fmt.Errorf("the kernel of %s has guest drivers as modules (%s); a template with a uniprocessor kernel needs both kernels with every guest driver built in, as deploy/kernel/build.sh builds them", d, strings.Join(mods, ", "))
		}
	}
	return nil
}

// prune removes all but the newest keep versions of a template, current
// counted among them. It never removes current, nor previous (the version
// current named before this build, "" if none): a node that loaded it
// keeps running it, so with keep 1 both stay until the next build.
func prune(root, current, previous string, keep int) []string {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	type ver struct {
		name string
		mod  time.Time
	}
	var vs []ver
	for _, e := range ents {
		if !e.IsDir() || e.Name() == current || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		fi, err := os.Stat(filepath.Join(root, e.Name(), guest.ManifestFile))
		if err != nil {
			continue
		}
		vs = append(vs, ver{e.Name(), fi.ModTime()})
	}
	sort.Slice(vs, func(i, j int) bool { return vs[i].mod.After(vs[j].mod) })
	var removed []string
	for i, v := range vs {
		if i+1 < keep || v.name == previous {
			continue
		}
		if os.RemoveAll(filepath.Join(root, v.name)) == nil {
			removed = append(removed, v.name)
		}
	}
	return removed
}

// pruneRootfsCache removes the template's cached debootstrap trees other
// than keep (those of an earlier package set, suite or mirror): each is a
// whole root file system, 1-2 GB, and nothing removed them. Other
// templates' trees are left alone, names sharing a prefix included.
func pruneRootfsCache(out, name, keep string) {
	re := regexp.MustCompile("^" + regexp.QuoteMeta(name) + "-rootfs-[0-9a-f]{16}$")
	ents, _ := os.ReadDir(filepath.Join(out, ".cache"))
	for _, e := range ents {
		dir := filepath.Join(out, ".cache", e.Name())
		if e.IsDir() && re.MatchString(e.Name()) && dir != keep {
			_ = os.RemoveAll(dir)
		}
	}
}

func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])[:16]
}

func writeManifest(dir string, m *guest.Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, guest.ManifestFile), append(b, '\n'), 0o644)
}

// extractVmlinux finds the xz stream in a bzImage and uncompresses it: QEMU
// boots the ELF (PVH) kernel on the microvm machine.
func extractVmlinux(vmlinuz, out string) error {
	b, err := os.ReadFile(vmlinuz)
	if err != nil {
		return err
	}
	magic := []byte{0xFD, '7', 'z', 'X', 'Z', 0x00}
	i := bytes.Index(b, magic)
	if i < 0 {
		return fmt.Errorf("kernel %s: no xz payload (only xz-compressed Debian kernels are supported)", vmlinuz)
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	// --single-stream stops at the stream's end and ignores the bytes
	// after it (the rest of the bzImage) without a word; a stream cut
	// short is an error.
	cmd := exec.Command("xz", "-dcq", "--single-stream")
	cmd.Stdin = bytes.NewReader(b[i:])
	cmd.Stdout = f
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("kernel %s: uncompressing its xz payload: %w: %s", vmlinuz, err, strings.TrimSpace(stderr.String()))
	}
	if err := f.Sync(); err != nil {
		return err
	}
	head := make([]byte, 4)
	if _, err := f.ReadAt(head, 0); err != nil || string(head) != "\x7fELF" {
		return fmt.Errorf("kernel %s: uncompressed payload is not an ELF file", vmlinuz)
	}
	return f.Close()
}

func buildInitramfs(agent, modDir, out string) error {
	mods, err := moduleOrder(modDir, GuestModules)
	if err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	w := &cpioWriter{w: f}
	for _, d := range []string{"dev", "proc", "sys", "etc", "etc/warren", "newroot", "lib", "lib/modules"} {
		w.Dir(d)
	}
	w.Char("dev/console", 5, 1)
	agentBin, err := os.ReadFile(agent)
	if err != nil {
		return err
	}
	w.File("init", 0o755, agentBin)
	dirs := map[string]bool{}
	var list []string
	for _, m := range mods {
		rel := filepath.Join("lib/modules", filepath.Base(modDir), m)
		for d := filepath.Dir(rel); d != "lib/modules" && d != "."; d = filepath.Dir(d) {
			if dirs[d] {
				break
			}
			dirs[d] = true
		}
		list = append(list, "/"+rel)
	}
	// Parents first.
	ds := make([]string, 0, len(dirs))
	for d := range dirs {
		ds = append(ds, d)
	}
	sort.Slice(ds, func(i, j int) bool {
		return strings.Count(ds[i], "/") < strings.Count(ds[j], "/") || (strings.Count(ds[i], "/") == strings.Count(ds[j], "/") && ds[i] < ds[j])
	})
	for _, d := range ds {
		w.Dir(d)
	}
	for _, m := range mods {
		b, err := os.ReadFile(filepath.Join(modDir, m))
		if err != nil {
			return err
		}
		w.File(filepath.Join("lib/modules", filepath.Base(modDir), m), 0o644, b)
	}
	w.File(strings.TrimPrefix(guest.ModuleList, "/"), 0o644, []byte(strings.Join(list, "\n")+"\n"))
	if err := w.Close(); err != nil {
		return err
	}
	return f.Close()
}

// debootstrap fills dir once; a finished dir (marked by .warren-done) is
// reused by later builds with the same packages.
func debootstrap(ctx context.Context, c Config, pkgs []string, dir string) error {
	done := filepath.Join(dir, ".warren-done")
	if _, err := os.Stat(done); err == nil {
		c.step("      reusing %s", dir)
		return nil
	}
	os.RemoveAll(dir)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", "--include="+strings.Join(pkgs, ","),
		c.Suite, dir, c.Mirror)
	if err := runLogged(cmd, c.Progress, "debootstrap"); err != nil {
		return err
	}
	// A sandbox has no network of its own yet; apt lists are dead weight.
	_ = os.RemoveAll(filepath.Join(dir, "var/cache/apt/archives"))
	_ = os.MkdirAll(filepath.Join(dir, "var/cache/apt/archives/partial"), 0o755)
	return os.WriteFile(done, nil, 0o644)
}

// runLogged runs cmd, passing every 50th line of its output as progress
// and keeping the tail for the error.
func runLogged(cmd *exec.Cmd, progress io.Writer, name string) error {
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	var tail []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 0, 4096)
		b := make([]byte, 4096)
		n := 0
		for {
			k, err := pr.Read(b)
			buf = append(buf, b[:k]...)
			for {
				i := bytes.IndexByte(buf, '\n')
				if i < 0 {
					break
				}
				line := string(buf[:i])
				buf = buf[i+1:]
				n++
				tail = append(tail, line)
				if len(tail) > 20 {
					tail = tail[1:]
				}
				if progress != nil && n%50 == 1 {
					fmt.Fprintf(progress, "image:       %s: %s\n", name, line)
				}
			}
			if err != nil {
				return
			}
		}
	}()
	err := cmd.Run()
	pw.Close()
	<-done
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", name, err, strings.Join(tail, "\n"))
	}
	return nil
}

// mkfs makes an ext4 image holding dir plus the agent (also at
// /usr/local/bin/warren-guest, for `warren-guest serve` in containers) with
// freeMB of room. It returns the file system's size.
func mkfs(ctx context.Context, c Config, agent, dir, out string) (int64, error) {
	bin := filepath.Join(dir, "usr/local/bin/warren-guest")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return 0, err
	}
	b, err := os.ReadFile(agent)
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		return 0, err
	}
	du, err := exec.CommandContext(ctx, "du", "-sm", dir).Output()
	if err != nil {
		return 0, fmt.Errorf("du %s: %w", dir, err)
	}
	var usedMB int64
	fmt.Sscan(string(du), &usedMB)
	size := (usedMB*11/10 + int64(c.FreeMB)) << 20
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", "warren-root", "-d", dir, "-E", "root_owner=0:0", "-m", "0", out, fmt.Sprintf("%dM", size>>20))
	if err := runLogged(cmd, c.Progress, "mkfs.ext4"); err != nil {
		return 0, err
	}
	return size, nil
}
