package pace

import (
	"bytes"
	"testing"
	"time"
)

func TestWaitSleepsInProportionToWork(t *testing.T) {
	var slept []time.Duration
	off := false
	p := &Pacer{K: 3, Max: 100 * time.Millisecond, Off: func() bool { return off }, Sleep: func(d time.Duration) { slept = append(slept, d) }}
	p.Wait() // nothing to pace yet
	if len(slept) != 0 {
		t.Fatalf("first Wait slept %v", slept)
	}
	const work = 10 * time.Millisecond
	p.last = time.Now().Add(-work)
	p.Wait()
	if len(slept) != 1 || slept[0] < 3*work || slept[0] > 3*work+20*time.Millisecond {
		t.Fatalf("after %v of work slept %v, want about %v", work, slept, 3*work)
	}
	p.last = time.Now().Add(-time.Second)
	p.Wait()
	if slept[1] != p.Max {
		t.Fatalf("after 1s away slept %v, want the cap %v", slept[1], p.Max)
	}
	off = true
	p.last = time.Now().Add(-work)
	p.Wait()
	if len(slept) != 2 {
		t.Fatalf("slept %v while off", slept[2:])
	}
}

func TestWriterPacesAndWritesEverything(t *testing.T) {
	var buf bytes.Buffer
	n := 0
	w := &Writer{W: &buf, Pacer: Pacer{K: 1, Max: time.Millisecond, Sleep: func(time.Duration) { n++ }}}
	for range 5 {
		if _, err := w.Write([]byte("abc")); err != nil {
			t.Fatal(err)
		}
	}
	if buf.String() != "abcabcabcabcabc" || n != 4 {
		t.Fatalf("wrote %q with %d sleeps; want every byte and 4 sleeps", buf.String(), n)
	}
}
