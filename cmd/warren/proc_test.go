package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/internal/freeaddr"
)

// warrenBin is the binary under test, built once by TestMain.
var warrenBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "warren-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	warrenBin = filepath.Join(dir, "warren")
	out, err := exec.Command("go", "build", "-o", warrenBin, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build warren: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is one `warren server` process on loopback.
type proc struct {
	t       *testing.T
	id      string
	dataDir string
	api     string // HOST:PORT
	raft    string
	extra   []string // on the first start only
	persist []string // on every start
	argv    []string // if set, the whole command line (a node daemon)
	env     []string // added to the test's environment
	cmd     *exec.Cmd
	up      atomic.Bool // set while the process runs; read by writers
	log     *os.File
	http    *http.Client
	tasks   warrenv1connect.TaskServiceClient
	cluster warrenv1connect.ClusterServiceClient
}

func newProc(t *testing.T, dir, id string, extra ...string) *proc {
	p := &proc{t: t, id: id, dataDir: filepath.Join(dir, id), api: freeaddr.Loopback(t), raft: freeaddr.Loopback(t), extra: extra}
	p.http = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	p.tasks = warrenv1connect.NewTaskServiceClient(p.http, p.url())
	p.cluster = warrenv1connect.NewClusterServiceClient(p.http, p.url())
	t.Cleanup(p.kill)
	return p
}

func (p *proc) url() string { return "http://" + p.api }

func (p *proc) start() {
	p.t.Helper()
	args := append([]string{"server", "--id", p.id, "--data", p.dataDir, "--api", p.api, "--raft", p.raft, "--log-level", "warn"}, p.extra...)
	args = append(args, p.persist...)
	if p.argv != nil {
		args = p.argv
	}
	var err error
	p.log, err = os.OpenFile(p.dataDir+".log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		p.t.Fatal(err)
	}
	p.cmd = exec.Command(warrenBin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if p.env != nil {
		p.cmd.Env = append(os.Environ(), p.env...)
	}
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.up.Store(true)
	p.extra = nil // --bootstrap / --join only on the first start
}

// kill SIGKILLs the process (no shutdown path runs) and waits for it.
func (p *proc) kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	p.up.Store(false)
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
	p.cmd = nil
	p.log.Close()
}

func (p *proc) status(ctx context.Context) (*warrenv1.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := p.cluster.Status(ctx, connect.NewRequest(&warrenv1.StatusRequest{}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (p *proc) logTail() string {
	b, _ := os.ReadFile(p.dataDir + ".log")
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func waitUntil(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startCluster starts three server processes and waits for 3 voters with a
// leader whose address every server knows. Servers get the persistent
// flags persist(i) if it is not nil.
func startCluster(t *testing.T) []*proc { return startClusterWith(t, t.TempDir(), nil) }

func startClusterWith(t *testing.T, dir string, persist func(i int) []string) []*proc {
	t.Helper()
	s1 := newProc(t, dir, "s1", "--bootstrap")
	s2 := newProc(t, dir, "s2", "--join", s1.url())
	s3 := newProc(t, dir, "s3", "--join", s1.url())
	if persist != nil {
		for i, p := range []*proc{s1, s2, s3} {
			p.persist = persist(i)
		}
	}
	s1.start()
	waitUntil(t, "s1 to lead", 60*time.Second, func() bool {
		st, err := s1.status(context.Background())
		return err == nil && st.GetRaftState() == "leader" && st.GetLeaderApiUrl() != ""
	})
	s2.start()
	s3.start()
	procs := []*proc{s1, s2, s3}
	waitUntil(t, "3 voters known everywhere", 90*time.Second, func() bool {
		for _, p := range procs {
			st, err := p.status(context.Background())
			if err != nil || len(st.GetPeers()) != 3 || st.GetLeaderApiUrl() == "" {
				return false
			}
		}
		return true
	})
	return procs
}

// leader returns the process that is leader now, or nil.
func leader(procs []*proc) *proc {
	for _, p := range procs {
		if !p.up.Load() {
			continue
		}
		if st, err := p.status(context.Background()); err == nil && st.GetRaftState() == "leader" {
			return p
		}
	}
	return nil
}
