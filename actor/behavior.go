package actor

// Behavior is what an actor does with its messages. Receive is called for
// one message at a time, never concurrently, on a goroutine owned by the
// runtime; c is valid only until Receive returns. A panic in Receive is a
// failure: it is logged, the message is dropped (a Request gets a
// *PanicError) and the actor's RestartPolicy decides what happens next.
//
// A Behavior holds the actor's state. On a restart the runtime discards it
// and calls the factory given to Spawn for a fresh one.
type Behavior interface {
	Receive(c *Context, msg any)
}

// BehaviorFunc adapts a function to Behavior.
type BehaviorFunc func(c *Context, msg any)

// Receive calls f(c, msg).
func (f BehaviorFunc) Receive(c *Context, msg any) { f(c, msg) }

// Starter is implemented by a Behavior that must run code when its
// incarnation begins (after Spawn and after every restart), before any
// message. A panic in Started is a failure, like one in Receive.
type Starter interface {
	Started(c *Context)
}

// Stopper is implemented by a Behavior that must release resources when its
// incarnation ends: when the actor stops, and before it restarts. Stopped is
// called on the actor's goroutine after its children were told to stop; it
// cannot reply to requests. A panic in Stopped is logged and ignored.
type Stopper interface {
	Stopped(c *Context)
}
