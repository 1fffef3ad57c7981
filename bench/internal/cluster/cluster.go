package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
)

// Options configures Start.
type Options struct {
	Binary     string   // the warren binary (required; see Build)
	Servers    int      // 0 means 3
	ServerArgs []string // extra flags for every server, e.g. --log-level=warn
	Gossip     bool     // give servers memberlist ports (for node daemons)
	Keep       bool     // keep the data directories and logs at exit
	// DaemonNice runs node daemon processes under `nice -n DaemonNice`
	// (0: not at all), so that a simulated fleet sharing the servers'
	// cores, as it does not in a real deployment, cannot starve the
	// servers' raft heartbeats.
	DaemonNice int
	Logf       func(string, ...any) // progress messages; nil discards
}

// Node is one server process, or one node daemon process (Daemon).
type Node struct {
	ID      string
	API     string // HOST:PORT
	Raft    string // HOST:PORT
	Gossip  string // HOST:PORT, when gossip is on
	Daemon  bool   // a `warren node` process, not a server
	Metrics string // HOST:PORT of a fleet process's /metrics
	URL     string // http://API
	Data    string // data directory
	Log     string // stdout and stderr of every incarnation, appended

	bin    string
	nice   int
	extra  []string
	status warrenv1connect.ClusterServiceClient

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// Cluster is a set of server processes on loopback. Its methods are safe
// for concurrent use.
type Cluster struct {
	Nodes   []*Node // servers
	Daemons []*Node // node daemons (StartDaemon)
	Dir     string

	logf       func(string, ...any)
	keep       bool
	daemonNice int
	closeOnce  sync.Once
}

// Start builds a cluster: the first server bootstraps, the others join it,
// and Start returns once every server agrees on a leader and lists all
// peers. The cluster is closed at exit (see Run) if the caller does not.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	if o.Binary == "" {
		return nil, errors.New("cluster: no binary")
	}
	if o.Servers == 0 {
		o.Servers = 3
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	dir, err := os.MkdirTemp("", "warren-bench-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, logf: o.Logf, keep: o.Keep, daemonNice: o.DaemonNice}
	atExit(c.Close)

	ports, err := freePorts(3 * o.Servers)
	if err != nil {
		c.Close()
		return nil, err
	}
	var gossip []string
	if o.Gossip {
		for i := range o.Servers {
			gossip = append(gossip, net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2*o.Servers+i])))
		}
	}
	hc := HTTPClient(false, 4)
	for i := range o.Servers {
		n := &Node{
			ID:    fmt.Sprintf("s%d", i+1),
			API:   net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2*i])),
			Raft:  net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2*i+1])),
			Data:  filepath.Join(dir, fmt.Sprintf("s%d", i+1)),
			Log:   filepath.Join(dir, fmt.Sprintf("s%d.log", i+1)),
			bin:   o.Binary,
			extra: o.ServerArgs,
		}
		n.URL = "http://" + n.API
		n.status = warrenv1connect.NewClusterServiceClient(hc, n.URL)
		if o.Gossip {
			n.Gossip = gossip[i]
			n.extra = append([]string{"--gossip", n.Gossip, "--join-gossip", strings.Join(gossip, ",")}, n.extra...)
		}
		c.Nodes = append(c.Nodes, n)
	}
	fail := func(err error) (*Cluster, error) {
		err = fmt.Errorf("%w\n%s", err, c.LogTails(15))
		c.Close()
		return nil, err
	}
	first := c.Nodes[0]
	if err := first.start("--bootstrap"); err != nil {
		return fail(err)
	}
	if err := c.waitFor(ctx, 30*time.Second, "first server to lead", func() error {
		st, err := first.Status(ctx)
		if err != nil {
			return err
		}
		if st.GetRaftState() != "leader" || st.GetLeaderApiUrl() == "" {
			return fmt.Errorf("%s is %s", first.ID, st.GetRaftState())
		}
		return nil
	}); err != nil {
		return fail(err)
	}
	for _, n := range c.Nodes[1:] {
		if err := n.start("--join", first.URL); err != nil {
			return fail(err)
		}
	}
	if _, err := c.WaitStable(ctx, 60*time.Second); err != nil {
		return fail(err)
	}
	o.Logf("cluster of %d servers up in %s (logs and data in %s)", o.Servers, dir, dir)
	return c, nil
}

// URLs returns every server's API URL.
func (c *Cluster) URLs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.URL
	}
	return out
}

// Node returns the server or node process with this id, or nil.
func (c *Cluster) Node(id string) *Node {
	for _, n := range append(append([]*Node{}, c.Nodes...), c.Daemons...) {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// WaitStable waits until every running server answers Status, all name the
// same leader (with its API URL known), the leader says it leads, and every
// server lists every peer with its API URL. It returns the leader.
func (c *Cluster) WaitStable(ctx context.Context, timeout time.Duration) (*Node, error) {
	var leader *Node
	err := c.waitFor(ctx, timeout, "a stable leader and all peers", func() error {
		leader = nil
		var leaderID string
		for _, n := range c.Nodes {
			if !n.Running() {
				return fmt.Errorf("%s is not running", n.ID)
			}
			st, err := n.Status(ctx)
			if err != nil {
				return err
			}
			switch {
			case st.GetLeaderId() == "" || st.GetLeaderApiUrl() == "":
				return fmt.Errorf("%s knows no leader", n.ID)
			case leaderID != "" && st.GetLeaderId() != leaderID:
				return fmt.Errorf("%s says %s leads, another says %s", n.ID, st.GetLeaderId(), leaderID)
			case len(st.GetPeers()) != len(c.Nodes):
				return fmt.Errorf("%s lists %d peers", n.ID, len(st.GetPeers()))
			}
			for _, p := range st.GetPeers() {
				if p.GetApiUrl() == "" || p.GetSuffrage() != "voter" {
					return fmt.Errorf("%s: peer %s is %q at %q", n.ID, p.GetId(), p.GetSuffrage(), p.GetApiUrl())
				}
			}
			leaderID = st.GetLeaderId()
			if st.GetRaftState() == "leader" {
				leader = n
			}
		}
		if leader == nil || leader.ID != leaderID {
			return fmt.Errorf("%s is named leader but does not say so", leaderID)
		}
		return nil
	})
	return leader, err
}

// waitFor polls check every 20 ms until it returns nil, and fails with the
// last check error once timeout passes.
func (c *Cluster) waitFor(ctx context.Context, timeout time.Duration, what string, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			if context.Cause(ctx) == context.Canceled {
				return ctx.Err()
			}
			return fmt.Errorf("waited %s for %s: last: %v", timeout, what, err)
		case <-t.C:
		}
	}
}

// StartDaemon starts a node daemon process, `warren node --driver sim`
// (simulated sandboxes) with the given extra flags, joined to the servers'
// gossip when the cluster has it.
func (c *Cluster) StartDaemon(id string, extra ...string) (*Node, error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	return c.startDaemon(id, ports[0], "", extra)
}

// StartFleet starts one node daemon process hosting count simulated nodes
// (`warren node --count`, ids ID-0001..., one memberlist member for the
// process), serving its counters at Metrics (http://HOST:PORT/metrics).
func (c *Cluster) StartFleet(id string, count int, extra ...string) (*Node, error) {
	base, err := consecutivePorts(2)
	if err != nil {
		return nil, err
	}
	metrics := net.JoinHostPort("127.0.0.1", strconv.Itoa(base))
	return c.startDaemon(id, base+1, metrics, append([]string{"--count", strconv.Itoa(count), "--metrics", metrics}, extra...))
}

// startDaemon starts `warren node --driver sim` with gossip on port, joined
// to the servers' gossip when the cluster has it.
func (c *Cluster) startDaemon(id string, port int, metrics string, extra []string) (*Node, error) {
	n := &Node{ID: id, Daemon: true, Gossip: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Metrics: metrics,
		Data: filepath.Join(c.Dir, id), Log: filepath.Join(c.Dir, id+".log"), bin: c.Nodes[0].bin, nice: c.daemonNice}
	n.extra = append([]string{"--servers", strings.Join(c.URLs(), ","), "--gossip", n.Gossip, "--driver", "sim"}, extra...)
	var gossip []string
	for _, s := range c.Nodes {
		if s.Gossip != "" {
			gossip = append(gossip, s.Gossip)
		}
	}
	if len(gossip) > 0 {
		n.extra = append(n.extra, "--join-gossip", strings.Join(gossip, ","))
	}
	c.Daemons = append(c.Daemons, n)
	return n, n.start()
}

// portCursor hands out port ranges in order, so that ranges given to
// processes that have not bound them yet never overlap.
var (
	portMu     sync.Mutex
	portCursor = 20000 + rand.IntN(4000)
)

// consecutivePorts finds n consecutive ports free for TCP and UDP on
// 127.0.0.1, below the ephemeral range, and returns the first.
func consecutivePorts(n int) (int, error) {
	portMu.Lock()
	defer portMu.Unlock()
	for try := 0; try < 200; try++ {
		if portCursor+n > 32000 {
			portCursor = 20000
		}
		base := portCursor
		portCursor += n
		ok := true
		var closers []func() error
		for p := base; p < base+n && ok; p++ {
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
			l, err := net.Listen("tcp", addr)
			if err != nil {
				ok = false
				break
			}
			closers = append(closers, l.Close)
			u, err := net.ListenPacket("udp", addr)
			if err != nil {
				ok = false
				break
			}
			closers = append(closers, u.Close)
		}
		for _, c := range closers {
			c()
		}
		if ok {
			return base, nil
		}
	}
	return 0, fmt.Errorf("no %d consecutive free ports", n)
}

// Close kills every process and removes the directory (unless Keep).
func (c *Cluster) Close() {
	c.closeOnce.Do(func() {
		all := append(append([]*Node{}, c.Nodes...), c.Daemons...)
		for _, n := range all {
			n.Kill()
		}
		for _, n := range all {
			n.wait(5 * time.Second)
		}
		if c.keep {
			c.logf("kept %s", c.Dir)
			return
		}
		os.RemoveAll(c.Dir)
	})
}

// LogTails returns the last lines of every server's log, for error reports.
func (c *Cluster) LogTails(lines int) string {
	var b strings.Builder
	for _, n := range append(append([]*Node{}, c.Nodes...), c.Daemons...) {
		data, _ := os.ReadFile(n.Log)
		ls := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(ls) > lines {
			ls = ls[len(ls)-lines:]
		}
		fmt.Fprintf(&b, "--- %s (%s), last %d lines:\n%s\n", n.ID, n.Log, len(ls), strings.Join(ls, "\n"))
	}
	return b.String()
}

func (n *Node) start(args ...string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil && !closed(n.exited) {
		return fmt.Errorf("%s: already running", n.ID)
	}
	logf, err := os.OpenFile(n.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	argv := append([]string{"server", "--id", n.ID, "--data", n.Data, "--api", n.API, "--raft", n.Raft}, args...)
	if n.Daemon {
		argv = append([]string{"node", "--id", n.ID, "--data", n.Data}, args...)
	}
	argv = append(argv, n.extra...)
	fmt.Fprintf(logf, "=== %s %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd := exec.Command(n.bin, argv...)
	if n.Daemon && n.nice > 0 {
		cmd = exec.Command("nice", append([]string{"-n", strconv.Itoa(n.nice), n.bin}, argv...)...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group, so a terminal's Ctrl-C reaches only the bench,
	// which then kills the servers; Pdeathsig kills them if the bench dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", n.ID, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	n.cmd, n.exited = cmd, exited
	return nil
}

// Restart starts a killed server again with the same id, ports and data
// directory; it recovers its state from disk, so no bootstrap or join.
func (n *Node) Restart() error {
	if !n.wait(10 * time.Second) {
		return fmt.Errorf("restart %s: still running", n.ID)
	}
	return n.start()
}

// Kill sends SIGKILL and returns the time taken just before the signal was
// sent. It does not wait for the process to exit; see WaitExit.
func (n *Node) Kill() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	t := time.Now()
	if n.cmd != nil && !closed(n.exited) {
		_ = n.cmd.Process.Signal(syscall.SIGKILL)
	}
	return t
}

// WaitExit waits up to timeout for the process to exit.
func (n *Node) WaitExit(timeout time.Duration) error {
	if !n.wait(timeout) {
		return fmt.Errorf("%s: not exited %s after SIGKILL", n.ID, timeout)
	}
	return nil
}

func (n *Node) wait(timeout time.Duration) bool {
	n.mu.Lock()
	ch := n.exited
	n.mu.Unlock()
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Running reports whether the process is alive.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil && !closed(n.exited)
}

// PID returns the process id, or 0.
func (n *Node) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || closed(n.exited) {
		return 0
	}
	return n.cmd.Process.Pid
}

// Status calls ClusterService.Status with a 2 s timeout.
func (n *Node) Status(ctx context.Context) (*warrenv1.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := n.status.Status(ctx, connect.NewRequest(&warrenv1.StatusRequest{}))
	if err != nil {
		return nil, fmt.Errorf("%s status: %w", n.ID, err)
	}
	return resp.Msg, nil
}

// HTTPClient returns a client for Connect calls to the servers. With h2c
// it speaks HTTP/2 without TLS (many streams per connection); otherwise
// HTTP/1.1 with up to conns pooled connections per server, one per
// concurrent call, as independent clients would have.
func HTTPClient(h2c bool, conns int) *http.Client {
	t := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
	}
	if h2c {
		t.Protocols = new(http.Protocols)
		t.Protocols.SetUnencryptedHTTP2(true)
	}
	return &http.Client{Transport: t}
}

// freePorts returns n ports free on 127.0.0.1, chosen below the kernel's
// ephemeral range so that no outgoing connection takes one of them while
// a killed server is down.
func freePorts(n int) ([]int, error) {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 12000 {
				lo = v
			}
		}
	}
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []int
	for try := 0; len(out) < n && try < 1000; try++ {
		p := lo - 10000 + rand.IntN(10000)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		ls = append(ls, l)
		out = append(out, p)
	}
	if len(out) < n {
		return nil, fmt.Errorf("found only %d free ports below %d", len(out), lo)
	}
	return out, nil
}

func closed(ch chan struct{}) bool {
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
