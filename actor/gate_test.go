package actor

import "time"

// gate lets a test hold an actor inside Receive.
type gate struct {
	entered chan struct{}
	release chan struct{}
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}, 1), release: make(chan struct{})}
}

// block is called by the behaviour: it signals entry and waits.
func (g *gate) block() {
	g.entered <- struct{}{}
	<-g.release
}

// hold sends "block" to r and returns once r's behaviour is inside block.
func (g *gate) hold(t tb, r *Ref) {
	t.Helper()
	if err := r.Send("block"); err != nil {
		t.Fatalf("send block: %v", err)
	}
	select {
	case <-g.entered:
	case <-time.After(bound):
		t.Fatalf("%s never blocked", r.ID())
	}
}

// open releases the behaviour; it is safe to call twice.
func (g *gate) open() {
	select {
	case <-g.release:
	default:
		close(g.release)
	}
}
