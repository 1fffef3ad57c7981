package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"sync"
	"syscall"
	"time"
)

// cleanups run once at exit, newest first: killing servers, removing dirs.
var (
	cleanupMu sync.Mutex
	cleanups  []func()
)

func atExit(f func()) {
	cleanupMu.Lock()
	defer cleanupMu.Unlock()
	cleanups = append(cleanups, f)
}

// cleanupAll runs every registered cleanup once. Safe to call repeatedly.
func cleanupAll() {
	cleanupMu.Lock()
	fs := cleanups
	cleanups = nil
	cleanupMu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// Run calls fn with a context that ends on SIGINT or SIGTERM, and returns
// the process exit code. Every cluster and binary created meanwhile is
// killed and removed when fn returns or panics; a second signal, or fn not
// returning within 15 s of the first, kills everything and exits at once.
// Children also get SIGKILL if the bench itself dies (Pdeathsig).
func Run(fn func(ctx context.Context) error) (code int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "\n%v: stopping (send again to kill now)\n", s)
		cancel()
		select {
		case <-sig:
		case <-time.After(15 * time.Second):
			fmt.Fprintln(os.Stderr, "not stopped after 15s; killing")
		}
		cleanupAll()
		os.Exit(130)
	}()
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "panic: %v\n%s", r, debug.Stack())
			cleanupAll()
			code = 2
		}
	}()
	err := fn(ctx)
	cleanupAll()
	if err != nil {
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "interrupted")
			return 130
		}
		fmt.Fprintln(os.Stderr, "error:", err)
		return 1
	}
	return 0
}

// Build compiles cmd/warren into a temporary directory (removed at exit)
// and returns the binary's path. It must run inside the warren module.
func Build(ctx context.Context, logf func(string, ...any)) (string, error) {
	dir, err := os.MkdirTemp("", "warren-bench-bin-")
	if err != nil {
		return "", err
	}
	atExit(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "warren")
	logf("building github.com/warrenhq/warren/cmd/warren into %s", dir)
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/warrenhq/warren/cmd/warren")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build (run from the warren module, or pass -warren): %w\n%s", err, out)
	}
	logf("built in %.1fs", time.Since(start).Seconds())
	return bin, nil
}
