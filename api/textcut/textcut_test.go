package textcut

import (
	"strings"
	"testing"
	"unicode/utf8"

	"pgregory.net/rapid"
)

func TestHeadTailEllipsis(t *testing.T) {
	s := "añb€c" // a, ñ (2 bytes), b, € (3 bytes), c
	for _, tc := range []struct {
		n          int
		head, tail string
	}{
		{-1, "", ""}, {0, "", ""}, {1, "a", "c"}, {2, "a", "c"}, {3, "añ", "c"},
		{4, "añb", "€c"}, {5, "añb", "b€c"}, {6, "añb", "b€c"}, {7, "añb€", "ñb€c"}, {8, "añb€c", "añb€c"}, {100, s, s},
	} {
		if got := Head(s, tc.n); got != tc.head {
			t.Errorf("Head(%q, %d) = %q, want %q", s, tc.n, got, tc.head)
		}
		if got := string(Head([]byte(s), tc.n)); got != tc.head {
			t.Errorf("Head([]byte, %d) = %q, want %q", tc.n, got, tc.head)
		}
		if got := Tail(s, tc.n); got != tc.tail {
			t.Errorf("Tail(%q, %d) = %q, want %q", s, tc.n, got, tc.tail)
		}
	}
	if got := Ellipsis(s, 3); got != "añ…" {
		t.Errorf("Ellipsis(%q, 3) = %q", s, got)
	}
	if got := Ellipsis(s, 8); got != s {
		t.Errorf("Ellipsis of a string that fits = %q", got)
	}
}

// A cut of valid text is valid text, within the budget, and as long as it
// can be: the next character would not have fitted.
func TestCutsStayValidAndFull(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := rapid.StringMatching(`[a-zñ€😀]{0,20}`).Draw(t, "s")
		n := rapid.IntRange(-2, len(s)+2).Draw(t, "n")
		h, tl := Head(s, n), Tail(s, n)
		for _, c := range []string{h, tl} {
			if !utf8.ValidString(c) || len(c) > max(n, 0) {
				t.Fatalf("cut %q of %q to %d: not valid or too long", c, s, n)
			}
		}
		if !strings.HasPrefix(s, h) || !strings.HasSuffix(s, tl) {
			t.Fatalf("Head %q / Tail %q are not of %q", h, tl, s)
		}
		if len(h) < len(s) {
			_, size := utf8.DecodeRuneInString(s[len(h):])
			if len(h)+size <= n {
				t.Fatalf("Head(%q, %d) = %q: the next character fits", s, n, h)
			}
		}
		if len(tl) < len(s) {
			_, size := utf8.DecodeLastRuneInString(s[:len(s)-len(tl)])
			if len(tl)+size <= n {
				t.Fatalf("Tail(%q, %d) = %q: the character before fits", s, n, tl)
			}
		}
	})
}
