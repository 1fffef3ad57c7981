package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/mount"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/noded/driver"
)

// A box's disk. Everything a container can write that lands on the node's
// disk (the overlay's upper and work directories, and /run/warren) lives on
// a file system of the box's own: a sparse ext4 image in the box's
// directory, mounted through a loop device. The image's size is the
// sandbox's disk quota less what the template's files take, so a sandbox
// that fills its disk sees ENOSPC, as in a microVM, and the node's disk
// holds at most the quota for it. Without it a `dd` in a container filled
// the node's disk.

const (
	diskImage = "disk.ext4" // in the box's directory
	diskMount = "disk"      // the image's mount point, in the box's directory

	// minWritable is the least room a box's disk must leave above the
	// template's files.
	minWritable = 16 << 20
)

// used returns the bytes the files of a mounted file system take.
func used(mnt string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", mnt, err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, nil
}

// writable is the size of a box's own file system for a disk of diskMB
// MiB over the template mounted at lower.
func writable(lower, template string, diskMB int) (int64, error) {
	u, err := used(lower)
	if err != nil {
		return 0, err
	}
	w := int64(diskMB)<<20 - u
	if w < minWritable {
		return 0, driver.Errorf(driver.ErrInvalid, "limits.disk_mb %d: template %s's files take %d MiB, so the disk must be at least %d MiB",
			diskMB, template, u>>20, (u+minWritable+(1<<20)-1)>>20)
	}
	return w, nil
}

// makeDisk makes the box's file system, size bytes, and mounts it at the
// box's diskMount. The image is a sparse copy of a blank one of that size
// (made once per run: mkfs.ext4 would cost each claim a process), so it
// takes on the node's disk what the box writes and ext4's metadata (about
// 1 MiB per GiB).
func (d *Driver) makeDisk(ctx context.Context, dir string, size int64) error {
	img := filepath.Join(dir, diskImage)
	if err := d.copyBlank(ctx, size, img); err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	mnt := filepath.Join(dir, diskMount)
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	// A loop device that detaches itself when the file system is
	// unmounted (autoclear).
	m := mount.Mount{Type: "ext4", Source: img, Options: []string{"loop", "nodev"}}
	if err := m.Mount(mnt); err != nil {
		return fmt.Errorf("disk: mount: %w", err)
	}
	return nil
}

// maxBlanks is how many blank images (of distinct sizes) a driver keeps;
// the least recently used goes first. Each takes ext4's metadata for its
// size on the node's disk (about 1 MiB per GiB of the size).
const maxBlanks = 4

// copyBlank copies an empty ext4 image of size bytes to dst, making the
// blank first unless this run made it and it is still there. The copy is
// made under blankMu, so no blank is removed while it is read.
func (d *Driver) copyBlank(ctx context.Context, size int64, dst string) error {
	p := filepath.Join(d.cfg.StateDir, "blank", fmt.Sprintf("%d.ext4", size))
	d.blankMu.Lock()
	defer d.blankMu.Unlock()
	if _, ok := d.blanks[p]; !ok || !fileExists(p) {
		delete(d.blanks, p)
		if err := makeBlank(ctx, p, size); err != nil {
			return err
		}
		for len(d.blanks) >= maxBlanks {
			oldest, at := "", uint64(0)
			for q, used := range d.blanks {
				if oldest == "" || used < at {
					oldest, at = q, used
				}
			}
			_ = os.Remove(oldest)
			delete(d.blanks, oldest)
		}
	}
	d.blankUse++
	d.blanks[p] = d.blankUse
	return copySparse(p, dst)
}

// makeBlank makes p, an empty ext4 image of size bytes, through a
// temporary file removed on failure (one left by a crash is made again).
func makeBlank(ctx context.Context, p string, size int64) (err error) {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp := p + ".tmp"
	_ = os.Remove(tmp)
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// No journal (a box does not outlive a crash of its node: its
	// directory is removed at the next start), no reserved blocks (the
	// quota is the box's), and the inode tables written lazily.
	if out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
		"-E", "lazy_itable_init=1,nodiscard", tmp).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return os.Rename(tmp, p)
}

// copySparse copies src to a new file dst, leaving src's holes holes.
func copySparse(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	if err := out.Truncate(fi.Size()); err != nil {
		return err
	}
	size := fi.Size()
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if err == unix.ENXIO { // no data after off
			break
		} else if err != nil {
			return fmt.Errorf("seek data in %s: %w", src, err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole in %s: %w", src, err)
		}
		for roff, woff := data, data; roff < hole; {
			n, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(hole-roff), 0)
			if err != nil {
				return fmt.Errorf("copy %s: %w", src, err)
			}
			if n == 0 {
				return fmt.Errorf("copy %s: short at %d", src, roff)
			}
		}
		off = hole
	}
	return nil
}

// unmountBox unmounts what a box's directory has mounted: the root (the
// overlay) first, then the disk under it. A mount that is still busy is
// detached lazily; its loop device goes when the last user does.
func unmountBox(dir string) error {
	var errs []error
	for _, m := range []string{filepath.Join(dir, "rootfs"), filepath.Join(dir, diskMount)} {
		if !isMounted(m) {
			continue
		}
		if err := unix.Unmount(m, 0); err != nil {
			if err2 := unix.Unmount(m, unix.MNT_DETACH); err2 != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err2))
			}
		}
	}
	return errors.Join(errs...)
}

const (
	// defaultDiskMB is a disk for a template whose manifest gives no size.
	defaultDiskMB = 4 << 10
	// maxDiskMB bounds a disk (1 TiB): the image is sparse, so this is
	// what a box may write, not what it takes.
	maxDiskMB = 1 << 20
)
