// Package pace spreads a burst of background work over a longer time, so
// that it leaves more of the CPU to foreground work meanwhile. A Pacer is
// called before each step of the work (a write of a file being produced)
// and sleeps K times as long as the work took since the previous call: the
// work then uses at most 1/(1+K) of a core while it runs, and takes 1+K
// times as long. Nothing is skipped.
package pace

import (
	"io"
	"time"
)

// Pacer paces one stream of work; it is not safe for concurrent use.
type Pacer struct {
	// K is the sleep per unit of work.
	K float64
	// Max bounds one sleep: a worker that was descheduled for long (which
	// counts as work) does not then sleep for as long again.
	Max time.Duration
	// Off, if set and true, makes Wait return at once (while foreground
	// work waits on this work, for example).
	Off func() bool
	// Sleep is time.Sleep unless set (tests).
	Sleep func(time.Duration)

	last time.Time
}

// Wait sleeps before the next step, in proportion to the work since the
// previous call returned. The first call does not sleep.
func (p *Pacer) Wait() {
	if !p.last.IsZero() && (p.Off == nil || !p.Off()) {
		d := min(time.Duration(float64(time.Since(p.last))*p.K), p.Max)
		if d > 0 {
			if p.Sleep != nil {
				p.Sleep(d)
			} else {
				time.Sleep(d)
			}
		}
	}
	p.last = time.Now()
}

// Writer paces every Write to W.
type Writer struct {
	W io.Writer
	Pacer
}

func (w *Writer) Write(b []byte) (int, error) {
	w.Wait()
	return w.W.Write(b)
}
