package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warrenhq/warren/netpolicy"
	"github.com/warrenhq/warren/noded"
	"github.com/warrenhq/warren/noded/driver/microvm"
	"github.com/warrenhq/warren/scheduler"
)

type serverFlags struct {
	cfg      scheduler.Config
	api      string
	logLevel string
	pprof    bool
}

func (f *serverFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.cfg.ID, "id", "", "server id, unique in the cluster (required)")
	fs.StringVar(&f.cfg.DataDir, "data", "", "data directory (required)")
	fs.StringVar(&f.api, "api", "127.0.0.1:7480", "HOST:PORT the API listens on")
	fs.StringVar(&f.cfg.RaftAddr, "raft", "", "HOST:PORT for raft traffic (required)")
	fs.BoolVar(&f.cfg.Bootstrap, "bootstrap", false, "form a new cluster with this server as its first voter")
	fs.StringVar(&f.cfg.JoinURL, "join", "", "API URL of a member to join through")
	fs.DurationVar(&f.cfg.HeartbeatTimeout, "heartbeat-timeout", scheduler.DefaultHeartbeatTimeout, "raft heartbeat timeout (also the leader's lease)")
	fs.DurationVar(&f.cfg.ElectionTimeout, "election-timeout", scheduler.DefaultElectionTimeout, "raft election timeout")
	fs.Uint64Var(&f.cfg.SnapshotThreshold, "snapshot-threshold", 16384, "raft entries between snapshots")
	fs.Uint64Var(&f.cfg.TrailingLogs, "trailing-logs", 10240, "raft entries kept after a snapshot")
	fs.DurationVar(&f.cfg.SnapshotInterval, "snapshot-interval", 30*time.Second, "how often to check whether to snapshot")
	fs.StringVar(&f.cfg.GossipAddr, "gossip", "", "HOST:PORT for memberlist gossip with node daemons (UDP and TCP); empty: heartbeats only")
	fs.Func("join-gossip", "comma-separated gossip HOST:PORTs of members to join", func(s string) error {
		f.cfg.JoinGossip = splitComma(s)
		return nil
	})
	fs.DurationVar(&f.cfg.NodeHeartbeat, "node-heartbeat", 500*time.Millisecond, "how often node daemons heartbeat")
	fs.DurationVar(&f.cfg.NodeTTL, "node-ttl", 3*time.Second, "a node without a heartbeat this long is declared down")
	fs.IntVar(&f.cfg.MaxStarting, "max-starting", scheduler.DefaultMaxStarting, "tasks placed but not yet running, cluster-wide: placement waits for starts beyond this")
	fs.IntVar(&f.cfg.MaxStreams, "max-streams", scheduler.DefaultMaxStreams, "event streams (task watch, SSE, node daemons' cancel watches) this server serves at once; past it, a new one is refused as unavailable, which sends clients to another server")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&f.pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on the API address")
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log-level: %q is not debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

func cmdServer(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	var f serverFlags
	f.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos); err != nil {
		return err
	}
	log, err := f.prepare(stderr)
	if err != nil {
		return err
	}
	return serve(f, log, nil)
}

func cmdDev(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	data := fs.String("data", ".warren/dev", "data directory")
	api := fs.String("api", "127.0.0.1:7480", "HOST:PORT the API listens on")
	raftAddr := fs.String("raft", "", "HOST:PORT for raft (default: the API port + 1 on the same host)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	nodeDriver := fs.String("node-driver", "sim", "driver of the built-in node daemon: auto, microvm, container, sim (simulated); \"none\" runs no node")
	fs.StringVar(nodeDriver, "driver", "sim", "same as --node-driver")
	imageDir := fs.String("image-dir", defaultImageDir(), "microvm: the template store (env WARREN_IMAGE_DIR)")
	accel := fs.String("accel", "auto", "microvm: accelerator: auto, kvm or tcg")
	runtime := fs.String("runtime", "runc", "container: runc, or runsc (gVisor through the runc shim; needs --egress off)")
	egress := fs.String("egress", "auto", "microvm and container: egress policy on, off (sandboxes get no network) or auto (on when root with /dev/net/tun)")
	egressUpstream := fs.String("egress-upstream", "", "egress: HOST:PORT of the DNS server allowed names are forwarded to (default: the first nameserver in /etc/resolv.conf)")
	capacity := fs.String("capacity", "", "the built-in node's capacity, cpu=N,mem=SIZE (default: this host's)")
	var ff forgeFlags
	ff.register(fs)
	fs.Lookup("allow-local-repos").DefValue = "true"
	ff.allowLocal = true // warren dev is one user's machine
	var mf modelFlags
	mf.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos); err != nil {
		return err
	}
	if *raftAddr == "" {
		host, port, err := net.SplitHostPort(*api)
		if err != nil {
			return fmt.Errorf("api: %q is not HOST:PORT: %v", *api, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p <= 0 || p >= 65535 {
			return fmt.Errorf("api: port %q must be 1..65534 (raft uses the next one)", port)
		}
		*raftAddr = net.JoinHostPort(host, strconv.Itoa(p+1))
	}
	f := serverFlags{api: *api, logLevel: *logLevel}
	f.cfg.ID = "dev"
	f.cfg.DataDir = *data
	f.cfg.RaftAddr = *raftAddr
	f.cfg.Bootstrap = true
	// The server's flags first: the node's config below makes its driver
	// and egress policy (network namespaces, links), which a flag error
	// found later would have to undo.
	log, err := f.prepare(stderr)
	if err != nil {
		return err
	}
	var startNode func(*slog.Logger) (io.Closer, error)
	if *nodeDriver != "none" {
		nf := nodeFlags{id: "dev", data: filepath.Join(*data, "node"), servers: "http://" + *api, driver: *nodeDriver, capacity: *capacity, tcgCacheMB: microvm.DefaultTCGCacheMB,
			imageDir: *imageDir, accel: *accel, runtime: *runtime, logger: log, gossip: "127.0.0.1:0", count: 1, forge: ff, model: mf,
			egress: egressFlags{mode: *egress, upstream: *egressUpstream, prefix4: netpolicy.DefaultPrefix4.String(), prefix6: netpolicy.DefaultPrefix6.String(), pool: 2}}
		cfg, err := nf.config()
		defer nf.unlock()
		// Until the node daemon has started and owns them, the driver and
		// the egress policy are this function's to close, on every
		// failure: a bad flag, a busy port, a locked data directory.
		started := false
		defer func() {
			if !started {
				cfg.Driver.Close()
				cfg.Egress.Close()
			}
		}()
		if err != nil {
			return err
		}
		if nf.why != "" {
			fmt.Fprintf(stderr, "warren dev: driver %s\n", strings.TrimPrefix(strings.TrimSpace(nf.why), "auto: "))
		}
		*nodeDriver = cfg.Driver.Name()
		cfg.GossipAddr, cfg.Address = "", "in-process"
		if err := cfg.Validate(); err != nil {
			return err
		}
		startNode = func(log *slog.Logger) (io.Closer, error) {
			cfg.Logger = log
			d, err := noded.Start(cfg)
			if err != nil {
				return nil, err
			}
			started = true
			return d, nil
		}
	}
	fmt.Fprintf(stdout, "warren dev: single-voter cluster and node daemon (driver %s), data in %s, API at http://%s\n", *nodeDriver, *data, *api)
	return serve(f, log, startNode)
}

// prepare checks the server's flags, every problem at once, and completes
// f.cfg from them; it takes no port and makes nothing on the host.
func (f *serverFlags) prepare(stderr io.Writer) (*slog.Logger, error) {
	log, err := newLogger(stderr, f.logLevel)
	if err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(f.api)
	if err != nil {
		return nil, fmt.Errorf("api: %q is not HOST:PORT: %v", f.api, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		return nil, fmt.Errorf("api: give the address other servers reach this one at, not %q", host)
	}
	f.cfg.APIURL = "http://" + f.api
	f.cfg.Logger = log
	f.cfg.RaftLogTo = stderr
	if f.cfg.DataDir != "" {
		if abs, err := filepath.Abs(f.cfg.DataDir); err == nil {
			f.cfg.DataDir = abs
		}
	}
	// Every flag error at once, before a port is taken (a busy port would
	// hide them).
	if err := f.cfg.Validate(); err != nil {
		return nil, err
	}
	return log, nil
}

// serve runs one scheduler peer, whose flags prepare has checked, until
// SIGINT or SIGTERM, and with it the node daemon that startNode starts, if
// any.
func serve(f serverFlags, log *slog.Logger, startNode func(*slog.Logger) (io.Closer, error)) error {
	ln, err := net.Listen("tcp", f.api)
	if err != nil {
		return fmt.Errorf("api: %w", err)
	}
	srv, err := scheduler.Open(f.cfg)
	if err != nil {
		ln.Close()
		return err
	}
	handler := srv.Handler()
	if f.pprof {
		mux := http.NewServeMux()
		servePprof(mux)
		mux.Handle("/", handler)
		handler = mux
	}
	hs := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	hs.Protocols = new(http.Protocols)
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	log.Info("serving", "server", f.cfg.ID, "api", f.cfg.APIURL, "raft", f.cfg.RaftAddr, "data", f.cfg.DataDir)
	var node io.Closer
	if startNode != nil {
		if node, err = startNode(log); err != nil {
			srv.Close()
			hs.Close()
			return fmt.Errorf("node: %w", err)
		}
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case s := <-sig:
		log.Info("shutting down", "signal", s.String())
	case err = <-errc:
		log.Error("api server failed", "err", err)
	case err = <-srv.Failed():
		log.Error("stopping: this server cannot serve", "err", err)
	}
	if node != nil {
		_ = node.Close()
	}
	// End the streams first, so the HTTP server's shutdown does not wait
	// for them; then wait (5 s at most, counted from here: the node's
	// close may have taken as long) for the requests in flight, then close
	// the store.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Quiesce()
	_ = hs.Shutdown(ctx)
	cerr := srv.Close()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return cerr
}

// servePprof serves Go's profiles under /debug/pprof/ on mux.
func servePprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}
