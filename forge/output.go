package forge

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/warrenhq/warren/api/textcut"
)

// maxStderrHead and maxStderrTail bound what the node keeps of a git
// command's stderr: its first and its last bytes, since git's last words
// ("fatal: …") come at the end. A remote can make git print without end
// (a fetch's "remote:" lines, an answer's body), and the node would hold
// all of it; the error quotes what is kept.
const (
	maxStderrHead = 512
	maxStderrTail = 1536
)

// headTail is an io.Writer that keeps the first maxStderrHead and the last
// maxStderrTail bytes written to it (and a character's worth more of each,
// to cut them at a character), and counts all.
type headTail struct {
	head, tail []byte // tail: up to twice its share, cut down once in a while
	total      int64
}

func (h *headTail) Write(p []byte) (int, error) {
	n := len(p)
	h.total += int64(n)
	if room := maxStderrHead + utf8.UTFMax - len(h.head); room > 0 {
		k := min(room, len(p))
		h.head = append(h.head, p[:k]...)
		p = p[k:]
	}
	keep := maxStderrTail + utf8.UTFMax
	if len(p) >= keep {
		h.tail = append(h.tail[:0], p[len(p)-keep:]...)
		return n, nil
	}
	h.tail = append(h.tail, p...)
	if len(h.tail) > 2*keep { // amortized O(1) a byte
		h.tail = append(h.tail[:0], h.tail[len(h.tail)-keep:]...)
	}
	return n, nil
}

// parts is what was kept: the head, the tail, and how many bytes were left
// out between them (0: head and tail are all that was written).
func (h *headTail) parts() (head, tail string, dropped int64) {
	head, tail = string(h.head), string(h.tail)
	if h.total == int64(len(head)+len(tail)) && len(head)+len(tail) <= maxStderrHead+maxStderrTail {
		return head, tail, 0
	}
	head, tail = textcut.Head(head, maxStderrHead), textcut.Tail(tail, maxStderrTail)
	return head, tail, h.total - int64(len(head)+len(tail))
}

// String is what was kept, for matching git's messages.
func (h *headTail) String() string {
	head, tail, _ := h.parts()
	return head + tail
}

// text is what was kept, trimmed, with secrets redacted: the whole of
// stderr, or its head, a line saying how much was left out, and its tail.
// Where bytes were left out, the head loses any end and the tail any start
// that could be part of a secret: the rest of it went with the bytes left
// out, so no redaction would find it.
func (h *headTail) text(secrets []string) string {
	head, tail, dropped := h.parts()
	if dropped == 0 {
		return redact(strings.TrimSpace(head+tail), secrets)
	}
	head, tail = redact(head, secrets), redact(tail, secrets)
	for _, s := range secrets {
		for k := min(len(s)-1, len(head)); k > 0; k-- {
			if strings.HasSuffix(head, s[:k]) {
				head = head[:len(head)-k]
				break
			}
		}
		for k := min(len(s)-1, len(tail)); k > 0; k-- {
			if strings.HasPrefix(tail, s[len(s)-k:]) {
				tail = tail[k:]
				break
			}
		}
	}
	return fmt.Sprintf("%s\n[... %d bytes of git's output left out ...]\n%s", strings.TrimSpace(head), dropped, strings.TrimSpace(tail))
}
