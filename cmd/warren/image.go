package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/warrenhq/warren/guest"
	"github.com/warrenhq/warren/noded/driver/microvm"
	"github.com/warrenhq/warren/noded/driver/microvm/image"
)

const imageUsage = `usage: warren image <command>

  build   build a guest template (kernel, initramfs, root file system) and
          boot it once to check it
  list    list the templates in the store

The store is --dir, or $WARREN_IMAGE_DIR, or /var/lib/warren/templates.
`

// defaultImageDir is where templates live unless told otherwise.
func defaultImageDir() string {
	if d := os.Getenv("WARREN_IMAGE_DIR"); d != "" {
		return d
	}
	return microvm.DefaultImageDir
}

func cmdImage(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, imageUsage)
		return errUsage
	}
	switch args[0] {
	case "build":
		return cmdImageBuild(args[1:], stdout, stderr)
	case "list", "ls":
		fs := flag.NewFlagSet("image list", flag.ContinueOnError)
		fs.SetOutput(stderr)
		dir := fs.String("dir", defaultImageDir(), "template store")
		if _, err := parse(fs, args[1:]); err != nil {
			return err
		}
		if st, err := os.Stat(*dir); err != nil {
			return fmt.Errorf("image list: --dir: %w", err) // a typo listed nothing, and exited 0
		} else if !st.IsDir() {
			return fmt.Errorf("image list: --dir %s: not a directory", *dir)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tVERSION\tKERNEL\tQEMU\tACCEL\tBOOT\tDISK\tCREATED")
		for _, n := range guest.ListTemplates(*dir) {
			t, err := guest.LoadTemplate(*dir, n)
			if err != nil {
				fmt.Fprintf(tw, "%s\t(broken: %v)\n", n, err)
				continue
			}
			kernel := t.KernelRelease
			if t.KernelUP != nil {
				kernel += " (1 vCPU: " + t.KernelUPRelease + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%dms\t%dMiB\t%s\n", t.Name, t.Version, kernel, t.QEMUVersion,
				t.Accelerator, t.BootMS, t.DiskBytes>>20, t.Created)
		}
		return tw.Flush()
	case "help", "-h", "--help":
		fmt.Fprint(stdout, imageUsage)
		return nil
	}
	fmt.Fprint(stderr, imageUsage)
	return fmt.Errorf("image: unknown command %q", args[0])
}

func cmdImageBuild(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("image build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := image.Config{Progress: stderr}
	fs.StringVar(&c.Name, "name", "default", "template name")
	fs.StringVar(&c.Out, "dir", defaultImageDir(), "template store to write into")
	fs.StringVar(&c.Kernel, "kernel", "", "the guest kernel, a vmlinuz named vmlinuz-RELEASE: Debian's or one deploy/kernel/build.sh built (default: the newest /boot/vmlinuz-*)")
	fs.StringVar(&c.Modules, "modules", "", "the kernel's modules directory, with modules.dep and modules.builtin (default: /lib/modules/RELEASE; deploy/kernel/build.sh leaves one beside its kernel, in modules/RELEASE)")
	fs.StringVar(&c.KernelUP, "kernel-up", "", "optional: a uniprocessor build of the kernel (vmlinuz-RELEASE, CONFIG_SMP off) for one-vCPU guests, the snapshot's and its clones' (deploy/kernel/build.sh --up); both kernels must have every guest driver built in")
	fs.StringVar(&c.ModulesUP, "modules-up", "", "the uniprocessor kernel's modules directory (default: /lib/modules/RELEASE)")
	exe, _ := os.Executable()
	fs.StringVar(&c.Agent, "agent", filepath.Join(filepath.Dir(exe), "warren-guest"), "the static warren-guest binary")
	fs.StringVar(&c.Suite, "suite", "bookworm", "Debian suite")
	fs.StringVar(&c.Mirror, "mirror", "http://deb.debian.org/debian", "Debian mirror")
	pkgs := fs.String("packages", "", "extra Debian packages, comma-separated")
	fs.IntVar(&c.FreeMB, "free-mb", 1024, "free space in the root file system (each sandbox's disk quota)")
	qemu := fs.String("qemu", "qemu-system-x86_64", "QEMU binary for the smoke boot")
	accel := fs.String("accel", "auto", "accelerator of the smoke boot: auto, kvm or tcg")
	noSmoke := fs.Bool("no-smoke", false, "skip the smoke boot")
	fs.IntVar(&c.Keep, "keep", 2, "versions of the template to keep in the store, the new one included (0 keeps all)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return fmt.Errorf("image build: unexpected argument %q", pos[0])
	}
	if *pkgs != "" {
		c.Packages = splitComma(*pkgs) // "jq, curl" is jq and curl, not " curl"
	}
	if c.Keep < 0 {
		return fmt.Errorf("image build: --keep %d: must not be negative", c.Keep)
	}
	if err := microvm.CheckAccel(*accel); err != nil {
		return fmt.Errorf("image build: --accel: %w", err)
	}
	if !*noSmoke {
		if _, err := exec.LookPath(*qemu); err != nil {
			return fmt.Errorf("image build: --qemu %s: not found (apt-get install qemu-system-x86 qemu-utils, or --no-smoke)", *qemu)
		}
		if v, err := microvm.QEMUVersion(*qemu); err == nil {
			c.QEMUVersion = v
		}
		work := filepath.Join(c.Out, ".work")
		c.Smoke = func(ctx context.Context, t *guest.Template) (string, time.Duration, error) {
			if err := os.MkdirAll(work, 0o755); err != nil {
				return "", 0, err
			}
			return microvm.SmokeBoot(ctx, *qemu, *accel, t, work)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t, err := image.Build(ctx, c)
	if err != nil {
		// A step ended by the signal fails as the step does ("signal:
		// killed" from debootstrap or mkfs), not always as ctx's error.
		if errors.Is(err, context.Canceled) || ctx.Err() != nil {
			return fmt.Errorf("image build: interrupted (%v)", err)
		}
		return fmt.Errorf("image build: %w", err)
	}
	fmt.Fprintf(stdout, "%s@%s %s\n", t.Name, t.Version, t.Dir)
	return nil
}
