package actor

// mailbox is a FIFO ring of envelopes. Its buffer is allocated on the first
// push, doubles up to the actor's capacity, and is dropped when the actor
// goes idle with a large buffer, so an idle actor holds at most keepBuf
// slots.
type mailbox struct {
	buf  []envelope
	head int32
	n    int32
}

const (
	minBuf  = 4
	keepBuf = 8
)

// push appends e, growing the buffer if it is full: up to limit, or past it
// when the caller already accepted more (timer messages).
func (m *mailbox) push(e envelope, limit int32) {
	if int(m.n) == len(m.buf) {
		size := max(int32(len(m.buf))*2, minBuf)
		if size > limit {
			size = max(limit, m.n+1)
		}
		buf := make([]envelope, size)
		for i := range m.n {
			buf[i] = m.buf[(m.head+i)%int32(len(m.buf))]
		}
		m.buf, m.head = buf, 0
	}
	m.buf[(m.head+m.n)%int32(len(m.buf))] = e
	m.n++
}

// pop removes and returns the oldest envelope. m.n > 0.
func (m *mailbox) pop() envelope {
	e := m.buf[m.head]
	m.buf[m.head] = envelope{}
	m.n--
	if m.n == 0 {
		m.head = 0
	} else {
		m.head = (m.head + 1) % int32(len(m.buf))
	}
	return e
}

// idle drops a large buffer of an empty mailbox.
func (m *mailbox) idle() {
	if m.n == 0 && len(m.buf) > keepBuf {
		m.buf = nil
	}
}

// drain empties the mailbox and returns the replies of queued requests.
func (m *mailbox) drain() []*reply {
	var replies []*reply
	for m.n > 0 {
		if e := m.pop(); e.reply != nil {
			replies = append(replies, e.reply)
		}
	}
	m.buf = nil
	return replies
}
