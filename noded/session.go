package noded

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenhq/warren/api/gen/warren/v1"
	"github.com/warrenhq/warren/api/gen/warren/v1/warrenv1connect"
	"github.com/warrenhq/warren/noded/driver"
)

// sessionLoop keeps one session with the leader, finding the leader again
// after every failure.
func (d *Daemon) sessionLoop() {
	defer d.wg.Done()
	h2c := d.h2c
	backoff := 20 * time.Millisecond
	var w sessionWarner
	for d.ctx.Err() == nil {
		url, err := d.findLeader()
		healthy := false
		if err == nil {
			start := time.Now()
			err = d.runSession(warrenv1connect.NewNodeServiceClient(h2c, url), url)
			if healthy = time.Since(start) > 5*time.Second; healthy {
				backoff = 20 * time.Millisecond // it was a healthy session
			}
		}
		if d.ctx.Err() != nil {
			return
		}
		d.log.Debug("session ended; reconnecting", "err", err, "backoff", backoff)
		if w.note(err, healthy, time.Now()) {
			d.log.Warn("no session with the servers; retrying", "servers", d.cfg.Servers, "for", w.span(time.Now()).Round(time.Second), "err", err)
		}
		select {
		case <-d.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// findLeader asks the servers who leads, and returns its API URL.
func (d *Daemon) findLeader() (string, error) {
	var errs []error
	for _, url := range d.cfg.Servers {
		cc := warrenv1connect.NewClusterServiceClient(d.plain, url)
		ctx, cancel := context.WithTimeout(d.ctx, time.Second)
		st, err := cc.Status(ctx, connect.NewRequest(&warrenv1.StatusRequest{}))
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if u := st.Msg.GetLeaderApiUrl(); u != "" {
			return u, nil
		}
		errs = append(errs, fmt.Errorf("%s: no leader known", url))
	}
	return "", fmt.Errorf("no leader: %w", errors.Join(errs...))
}

// errLeaderSilent ends a session whose leader, which acknowledges
// heartbeats, has said nothing for a TTL.
var errLeaderSilent = errors.New("no word from the leader within its ttl")

// runSession holds one session until it breaks: Hello, then heartbeats
// every interval the leader asks for, while commands are applied as they
// come.
func (d *Daemon) runSession(nc warrenv1connect.NodeServiceClient, url string) error {
	ctx, cancelCause := context.WithCancelCause(d.ctx)
	cancel := func() { cancelCause(nil) }
	defer cancel()
	defer d.dropYields()
	d.net.whenCut(cancel)
	stream := nc.Session(ctx)
	defer stream.CloseResponse()
	// A cancelled context does not always unblock Receive (through the
	// fault-injecting transport it did not, and Close then waited until the
	// leader cut the session); closing the response does.
	stopClose := context.AfterFunc(ctx, func() { _ = stream.CloseResponse() })
	defer stopClose()
	hello := &warrenv1.SessionRequest{Msg: &warrenv1.SessionRequest_Hello{Hello: &warrenv1.Hello{
		Node: d.node(), Incarnation: d.incarnation, Running: d.running(), Verifying: d.Verifying()}}}
	if err := stream.Send(hello); err != nil {
		return err
	}
	first, err := stream.Receive()
	if err != nil {
		return err
	}
	w := first.GetWelcome()
	if w == nil {
		return errors.New("leader did not welcome the session")
	}
	d.mu.Lock()
	d.stats.Sessions++
	d.mu.Unlock()
	// A target the leader sends again while the session is open (resend)
	// is older than any set directly on this node since it opened.
	openMark := d.sessionMark()
	every := orDuration(time.Duration(w.GetHeartbeatIntervalMs())*time.Millisecond, orDuration(d.cfg.Heartbeat, 500*time.Millisecond))
	d.log.Info("session opened", "leader", w.GetLeaderId(), "url", url, "heartbeat", every)
	// A leader that acknowledges heartbeats says something at least every
	// ttl/3 while it hears them. Hearing nothing for a ttl, the node gives
	// the session up and finds the leader again: the leader vanished
	// without closing the connection (power loss, partition), or no longer
	// hears the node, and a new leader declares down a node it does not
	// hear from. A leader that predates acks may be quiet for long on a
	// healthy session, so the watchdog waits for the Welcome to say so.
	// Only time spent waiting on the leader counts, not time spent applying
	// what it sent (a burst of starts on a starved CPU).
	receive := stream.Receive
	if ttl := time.Duration(w.GetTtlMs()) * time.Millisecond; w.GetAcksHeartbeats() && ttl > 0 {
		watchdog := time.AfterFunc(ttl, func() { cancelCause(fmt.Errorf("%w (%s)", errLeaderSilent, ttl)) })
		defer watchdog.Stop()
		receive = func() (*warrenv1.SessionResponse, error) {
			watchdog.Reset(ttl)
			m, err := stream.Receive()
			watchdog.Stop()
			return m, err
		}
	}

	sendErr := make(chan error, 1)
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		var seq uint64
		for {
			select {
			case <-ctx.Done():
				sendErr <- ctx.Err()
				return
			case <-t.C:
			}
			seq++
			hb := &warrenv1.SessionRequest{Msg: &warrenv1.SessionRequest_Heartbeat{Heartbeat: &warrenv1.Heartbeat{
				Seq: seq, Running: uint32(d.Running()), Warm: d.warmSandboxes(), Verifying: d.Verifying()}}}
			if err := stream.Send(hb); err != nil {
				sendErr <- err
				cancel()
				return
			}
		}
	}()
	for {
		m, err := receive()
		if err != nil {
			if cause := context.Cause(ctx); errors.Is(cause, errLeaderSilent) {
				d.log.Warn("leader silent; finding the leader again", "leader", w.GetLeaderId(), "url", url)
				err = cause
			}
			cancel()
			<-sendErr
			return err
		}
		// Messages this node does not know (from a newer leader) have no
		// case and are ignored.
		switch c := m.GetMsg().(type) {
		case *warrenv1.SessionResponse_Start:
			d.startTask(c.Start)
		case *warrenv1.SessionResponse_Stop:
			d.stopTask(c.Stop)
		case *warrenv1.SessionResponse_Keep:
			d.keepTask(c.Keep)
		case *warrenv1.SessionResponse_SetPoolTarget:
			d.log.Info("pool target", "template", c.SetPoolTarget.GetTemplate(), "target", c.SetPoolTarget.GetTarget())
			t, n := c.SetPoolTarget.GetTemplate(), int(c.SetPoolTarget.GetTarget())
			mark := d.sessionMark()
			if c.SetPoolTarget.GetResend() {
				// The record changed while the session was open. A
				// direct set since the session opened is the record's
				// own call, or a newer per-node target (`pool set
				// --node`): either way the node has what it should.
				mark = openMark
			}
			d.applyPoolsLater(func() { d.setPoolTarget(t, n, mark) })
		case *warrenv1.SessionResponse_PoolTargets:
			set, mark := c.PoolTargets.GetTargets(), d.sessionMark()
			d.applyPoolsLater(func() { d.setPoolTargets(set, mark) })
		case *warrenv1.SessionResponse_Ack:
			// Only a sign of life, which receive has noted.
		}
	}
}

// applyPoolsLater applies pool targets from the leader's session (f) on a
// goroutine of their own, in the order they came: the driver's call may
// take seconds (the microVM driver loads the template, and destroys the
// VMs a smaller target drops), and meanwhile the session must go on
// reading, for its StartTasks and for the acks without which the node
// takes the leader for gone. Targets queued when the daemon closes are
// dropped; the next session sends the cluster's again.
func (d *Daemon) applyPoolsLater(f func()) {
	d.mu.Lock()
	if d.closing { // Close is waiting on d.wg: it must not grow now
		d.mu.Unlock()
		return
	}
	d.poolQ = append(d.poolQ, f)
	if d.poolBusy {
		d.mu.Unlock()
		return
	}
	d.poolBusy = true
	d.wg.Add(1)
	d.mu.Unlock()
	go func() {
		defer d.wg.Done()
		for {
			d.mu.Lock()
			if len(d.poolQ) == 0 || d.closing {
				d.poolQ, d.poolBusy = nil, false
				d.mu.Unlock()
				return
			}
			f := d.poolQ[0]
			d.poolQ = d.poolQ[1:]
			d.mu.Unlock()
			f()
		}
	}()
}

// warmSandboxes is what the heartbeat reports of the driver's warm pools:
// the ready sandboxes per template, templates with none left out; nil when
// the driver keeps no pools (it is no driver.Pooler) or all are empty. The
// leader places tasks of a template preferably where one waits, and looks
// a task without a template up under the name the drivers resolve "" to
// ("default"), which is the name a pool of it reports.
func (d *Daemon) warmSandboxes() map[string]uint32 {
	p, ok := d.cfg.Driver.(driver.Pooler)
	if !ok {
		return nil
	}
	var warm map[string]uint32
	for _, st := range p.Pools() {
		if st.Ready <= 0 {
			continue
		}
		if warm == nil {
			warm = map[string]uint32{}
		}
		warm[st.Template] = uint32(st.Ready)
	}
	return warm
}

func orDuration(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// sessionWarner says when a node that cannot hold a session should say so
// above debug: the servers refusing its hello (a bad --id, label or
// template, or its --id live on another node: every retry is refused the
// same way) at once, and any other
// failure once it has lasted warnAfter; then again each warnEvery, or when
// the error changes. A healthy session starts over.
type sessionWarner struct {
	since, last time.Time
	lastErr     string
}

const (
	warnAfter = 10 * time.Second
	warnEvery = time.Minute
)

func (w *sessionWarner) note(err error, healthy bool, now time.Time) bool {
	if healthy || w.since.IsZero() {
		*w = sessionWarner{since: now}
	}
	if err == nil {
		return false
	}
	refused := connect.CodeOf(err) == connect.CodeInvalidArgument || connect.CodeOf(err) == connect.CodeAlreadyExists
	msg := err.Error()
	if connect.CodeOf(err) == connect.CodeAlreadyExists {
		msg = "already_exists" // its text says how long ago the other node was heard
	}
	if !refused && now.Sub(w.since) < warnAfter {
		return false
	}
	if w.last.IsZero() || now.Sub(w.last) >= warnEvery || (refused && msg != w.lastErr) {
		w.last, w.lastErr = now, msg
		return true
	}
	return false
}

func (w *sessionWarner) span(now time.Time) time.Duration { return now.Sub(w.since) }
