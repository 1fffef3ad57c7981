package noded_test

import (
	"context"
	"maps"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/noded"
	"github.com/warrenhq/warren/noded/driver"
	"github.com/warrenhq/warren/noded/driver/sim"
)

// fakeLeader answers Status with a fixed leader URL and holds sessions:
// it welcomes each, then reads heartbeats until the stream ends,
// acknowledging each one if ack is set.
type fakeLeader struct {
	warrenv1connect.UnimplementedClusterServiceHandler
	warrenv1connect.UnimplementedNodeServiceHandler
	ttl       time.Duration
	advertise bool         // Welcome says the leader acknowledges heartbeats
	ack       bool         // and it does
	leaderURL atomic.Value // string
	hellos    atomic.Int32
	warm      atomic.Pointer[map[string]uint32] // the last heartbeat's warm counts
	// push is sent after the Welcome; later, while the session lasts.
	push  []*warrenv1.SessionResponse
	later chan *warrenv1.SessionResponse
}

func (f *fakeLeader) Status(context.Context, *connect.Request[warrenv1.StatusRequest]) (*connect.Response[warrenv1.StatusResponse], error) {
	return connect.NewResponse(&warrenv1.StatusResponse{LeaderApiUrl: f.leaderURL.Load().(string)}), nil
}

func (f *fakeLeader) Session(ctx context.Context, st *connect.BidiStream[warrenv1.SessionRequest, warrenv1.SessionResponse]) error {
	if _, err := st.Receive(); err != nil {
		return err
	}
	f.hellos.Add(1)
	if err := st.Send(&warrenv1.SessionResponse{Msg: &warrenv1.SessionResponse_Welcome{Welcome: &warrenv1.Welcome{
		LeaderId: "fake", HeartbeatIntervalMs: f.ttl.Milliseconds() / 10, TtlMs: f.ttl.Milliseconds(),
		AcksHeartbeats: f.advertise}}}); err != nil {
		return err
	}
	for _, m := range f.push {
		if err := st.Send(m); err != nil {
			return err
		}
	}
	var smu sync.Mutex // the stream's sends, from here and from later
	if f.later != nil {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		defer func() { close(stop); wg.Wait() }() // no send after the handler returns
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				case m := <-f.later:
					smu.Lock()
					_ = st.Send(m)
					smu.Unlock()
				}
			}
		}()
	}
	for {
		m, err := st.Receive()
		if err != nil {
			return err
		}
		if hb := m.GetHeartbeat(); hb != nil {
			w := hb.GetWarm()
			f.warm.Store(&w)
		}
		if f.ack {
			smu.Lock()
			err := st.Send(&warrenv1.SessionResponse{Msg: &warrenv1.SessionResponse_Ack{Ack: &warrenv1.HeartbeatAck{
				Seq: m.GetHeartbeat().GetSeq()}}})
			smu.Unlock()
			if err != nil {
				return err
			}
		}
	}
}

// serve starts f on a cleartext HTTP/1 and HTTP/2 listener and returns
// its address.
func (f *fakeLeader) serve(t *testing.T) string {
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewClusterServiceHandler(f))
	mux.Handle(warrenv1connect.NewNodeServiceHandler(f))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: mux}
	hs.Protocols = new(http.Protocols)
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return ln.Addr().String()
}

func startNodeOn(t *testing.T, server string) *noded.Daemon {
	return startNodeWithDriver(t, server, sim.New(sim.Config{}))
}

func startNodeWithDriver(t *testing.T, server string, drv driver.Driver) *noded.Daemon {
	d, err := noded.Start(noded.Config{ID: "n1", DataDir: t.TempDir(), Servers: []string{server},
		Driver: drv, Capacity: &warrenv1.Resources{MilliCpu: 1000, MemoryBytes: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// blackhole is a TCP proxy that, once cut, stops moving bytes in either
// direction but keeps every connection open: what a node sees when the
// leader's host loses power or is partitioned away (no FIN, no RST).
type blackhole struct {
	ln    net.Listener
	cut   atomic.Bool
	mu    sync.Mutex
	conns []net.Conn
	stop  chan struct{}
}

func newBlackhole(t *testing.T, to string) *blackhole {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, stop: make(chan struct{})}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if b.cut.Load() {
				c.Close() // new connections are refused, as to a dead host (fast fail)
				continue
			}
			u, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			b.mu.Lock()
			b.conns = append(b.conns, c, u)
			b.mu.Unlock()
			go b.pipe(c, u)
			go b.pipe(u, c)
		}
	}()
	t.Cleanup(func() {
		close(b.stop)
		ln.Close()
		b.mu.Lock()
		for _, c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
	})
	return b
}

func (b *blackhole) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if b.cut.Load() {
			<-b.stop // swallow: never forward, never close
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// After the leader's host vanishes without closing its TCP connections,
// the node gives up the session and looks for a leader again within a
// few TTLs; otherwise the new leader, hearing nothing from it, declares
// this healthy node down (2 × TTL) and requeues all its tasks, and the
// node stays away until the kernel's TCP retransmission timeout (~15
// min). The leader here predates heartbeat acks: the transport's HTTP/2
// pings notice.
func TestNodeNoticesABlackholedLeader(t *testing.T) {
	f := &fakeLeader{ttl: time.Second}
	direct := f.serve(t)
	bh := newBlackhole(t, direct)
	f.leaderURL.Store("http://" + bh.ln.Addr().String())
	startNodeOn(t, "http://"+direct)
	waitFor(t, "first session", 5*time.Second, func() bool { return f.hellos.Load() == 1 })

	// The old leader's host disappears; a new leader is at direct.
	f.leaderURL.Store("http://" + direct)
	bh.cut.Store(true)
	waitFor(t, "the node to find the new leader within 5 × ttl", 5*f.ttl, func() bool { return f.hellos.Load() >= 2 })
}

// A leader that acknowledges heartbeats but goes quiet on a connection
// that still answers pings (it no longer hears the node, or its session
// is stuck) loses the session within the TTL it gave, and the node finds
// the leader again.
func TestNodeLeavesALeaderThatStopsAcking(t *testing.T) {
	f := &fakeLeader{ttl: 300 * time.Millisecond, advertise: true}
	f.leaderURL.Store("http://" + f.serve(t))
	startNodeOn(t, f.leaderURL.Load().(string))
	waitFor(t, "the node to leave the silent leader and say hello again", 10*f.ttl, func() bool { return f.hellos.Load() >= 2 })
}

// A quiet session is kept when the leader acknowledges heartbeats, and
// when it predates acks (it says nothing on a healthy session, so the
// node must not take silence for a vanished leader).
func TestNodeKeepsAQuietSession(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    *fakeLeader
	}{
		{"acking leader", &fakeLeader{ttl: 300 * time.Millisecond, advertise: true, ack: true}},
		{"leader without acks", &fakeLeader{ttl: 300 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.f
			f.leaderURL.Store("http://" + f.serve(t))
			d := startNodeOn(t, f.leaderURL.Load().(string))
			waitFor(t, "first session", 5*time.Second, func() bool { return f.hellos.Load() == 1 })
			time.Sleep(10 * f.ttl) // nothing to wait for: the session must simply last
			if n := f.hellos.Load(); n != 1 {
				t.Fatalf("the node opened %d sessions in 10 × ttl on a healthy leader (stats %+v)", n, d.Stats())
			}
		})
	}
}

// A real leader acknowledges heartbeats often enough that an idle node
// keeps its session: the watchdog fires on no healthy session.
func TestIdleNodeKeepsItsSessionWithTheLeader(t *testing.T) {
	c := startCluster(t, 1, time.Second)
	d := c.startNode("n1", 0)
	time.Sleep(5 * time.Second) // nothing to wait for: the session must simply last
	if n := d.Stats().Sessions; n != 1 {
		t.Fatalf("the node opened %d sessions in 5 × ttl with a healthy leader", n)
	}
}

// pooledSim is the simulated driver with warm pools to report.
type pooledSim struct {
	*sim.Driver
	mu    sync.Mutex
	pools []driver.PoolStatus
}

func (p *pooledSim) Pools() []driver.PoolStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]driver.PoolStatus(nil), p.pools...)
}

func (p *pooledSim) set(pools ...driver.PoolStatus) {
	p.mu.Lock()
	p.pools = pools
	p.mu.Unlock()
}

// Every heartbeat carries the ready sandboxes of the driver's warm pools
// per template, as they are when it is sent (templates with none left
// out), so the leader can place a task where a warm sandbox of its
// template waits.
func TestHeartbeatReportsReadyWarmSandboxes(t *testing.T) {
	f := &fakeLeader{ttl: 300 * time.Millisecond, advertise: true, ack: true}
	f.leaderURL.Store("http://" + f.serve(t))
	drv := &pooledSim{Driver: sim.New(sim.Config{})}
	drv.set(driver.PoolStatus{Template: "default", Target: 2, Ready: 2},
		driver.PoolStatus{Template: "py", Target: 1, Filling: 1})
	startNodeWithDriver(t, f.leaderURL.Load().(string), drv)
	reports := func(want map[string]uint32) func() bool {
		return func() bool {
			w := f.warm.Load()
			return w != nil && maps.Equal(*w, want)
		}
	}
	waitFor(t, "a heartbeat reporting 2 warm default sandboxes", 5*time.Second, reports(map[string]uint32{"default": 2}))
	// A claim takes one default sandbox; py's fills.
	drv.set(driver.PoolStatus{Template: "default", Target: 2, Ready: 1, Filling: 1},
		driver.PoolStatus{Template: "py", Target: 1, Ready: 1})
	waitFor(t, "a heartbeat reporting the pools' new ready counts", 5*time.Second, reports(map[string]uint32{"default": 1, "py": 1}))
	drv.set(driver.PoolStatus{Template: "default", Target: 2, Filling: 2})
	waitFor(t, "a heartbeat reporting no warm sandbox", 5*time.Second, reports(map[string]uint32{}))
}

// slowPoolSim is the simulated driver whose SetPoolTarget waits for
// release, as the microVM driver's may take seconds (it loads the
// template, and destroys the VMs a smaller target drops).
type slowPoolSim struct {
	*sim.Driver
	called  chan struct{} // closed when SetPoolTarget began
	once    sync.Once
	release chan struct{}
}

func (s *slowPoolSim) SetPoolTarget(t string, n int) {
	s.once.Do(func() { close(s.called) })
	<-s.release
	s.Driver.SetPoolTarget(t, n)
}

// A pool target from the leader is applied off the session's receive
// loop: while the driver's call is slow, the node goes on with what the
// leader sends next (a StartTask here; and the leader cuts a session
// whose queue it cannot empty), and keeps its session.
func TestSlowPoolTargetHoldsUpNoStart(t *testing.T) {
	f := &fakeLeader{ttl: 2 * time.Second, advertise: true, ack: true, push: []*warrenv1.SessionResponse{
		{Msg: &warrenv1.SessionResponse_SetPoolTarget{SetPoolTarget: &warrenv1.SetPoolTarget{Template: "default", Target: 2}}},
		{Msg: &warrenv1.SessionResponse_Start{Start: &warrenv1.StartTask{TaskId: "t1", Epoch: 1}}},
	}}
	f.leaderURL.Store("http://" + f.serve(t))
	drv := &slowPoolSim{Driver: sim.New(sim.Config{}), called: make(chan struct{}), release: make(chan struct{})}
	d := startNodeWithDriver(t, f.leaderURL.Load().(string), drv)
	t.Cleanup(func() { close(drv.release) }) // before the node's Close, which waits for the call
	select {
	case <-drv.called:
	case <-time.After(10 * time.Second):
		t.Fatal("the pool target never reached the driver")
	}
	waitFor(t, "the StartTask sent after the pool target to start an actor", 5*time.Second, func() bool { return d.Stats().Started >= 1 })
	if n := f.hellos.Load(); n != 1 {
		t.Fatalf("the node opened %d sessions while a pool target was applied (stats %+v)", n, d.Stats())
	}
}

// targetSim is the simulated driver with warm-pool targets recorded (a
// driver.Pooler).
type targetSim struct {
	*sim.Driver
	mu      sync.Mutex
	targets map[string]int
}

func (p *targetSim) SetPoolTarget(t string, n int) {
	p.mu.Lock()
	p.targets[t] = n
	p.mu.Unlock()
}

func (p *targetSim) Pools() []driver.PoolStatus { return nil }

func (p *targetSim) target(t string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.targets[t]
}

// A target the leader sends again while the session is open (resend: the
// cluster's record changed) does not undo a target set directly on the
// node since the session opened: `warren pool set` records its target
// after its direct calls, so the resend comes after them, and a `pool set
// --node` made meanwhile would otherwise be lost. A resend for a template
// not set directly since is applied (a node the direct call missed gets
// the target that way).
func TestPoolResendKeepsADirectSetSinceTheSessionOpened(t *testing.T) {
	f := &fakeLeader{ttl: 10 * time.Second, advertise: true, ack: true, later: make(chan *warrenv1.SessionResponse, 4),
		push: []*warrenv1.SessionResponse{
			{Msg: &warrenv1.SessionResponse_SetPoolTarget{SetPoolTarget: &warrenv1.SetPoolTarget{Template: "default", Target: 1}}},
		}}
	f.leaderURL.Store("http://" + f.serve(t))
	drv := &targetSim{Driver: sim.New(sim.Config{}), targets: map[string]int{}}
	d, err := noded.Start(noded.Config{ID: "n1", DataDir: t.TempDir(), Servers: []string{f.leaderURL.Load().(string)},
		Driver: drv, SandboxListen: "127.0.0.1:0", Capacity: &warrenv1.Resources{MilliCpu: 1000, MemoryBytes: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	waitFor(t, "the session's target", 5*time.Second, func() bool { return drv.target("default") == 1 })
	// `warren pool set default 7 --node n1`: a direct call only.
	if _, err := d.Sandboxes.SetPoolTarget(context.Background(), connect.NewRequest(&warrenv1.SetPoolTargetRequest{Template: "default", Target: 7})); err != nil {
		t.Fatal(err)
	}
	// The leader resends the cluster's record of an earlier `pool set`,
	// then one for a template set on no node directly.
	f.later <- &warrenv1.SessionResponse{Msg: &warrenv1.SessionResponse_SetPoolTarget{SetPoolTarget: &warrenv1.SetPoolTarget{Template: "default", Target: 3, Resend: true}}}
	f.later <- &warrenv1.SessionResponse{Msg: &warrenv1.SessionResponse_SetPoolTarget{SetPoolTarget: &warrenv1.SetPoolTarget{Template: "py", Target: 2, Resend: true}}}
	waitFor(t, "the resent py target", 5*time.Second, func() bool { return drv.target("py") == 2 })
	if got := drv.target("default"); got != 7 {
		t.Errorf("default's target %d after the resend: want the direct set's 7", got)
	}
}
