// Package textcut cuts text to a byte budget without splitting a UTF-8
// character: a cut inside one would leave bytes that are not UTF-8 in
// logs, errors and events (JSON replaces them with U+FFFD, the API refuses
// them in payloads).
package textcut

import "unicode/utf8"

// Head is the first at most n bytes of s, ending before a character, not
// inside one. A negative n counts as 0.
func Head[T ~string | ~[]byte](s T, n int) T {
	if len(s) <= n {
		return s
	}
	n = max(n, 0)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Tail is the last at most n bytes of s, starting at a character, not
// inside one. A negative n counts as 0.
func Tail[T ~string | ~[]byte](s T, n int) T {
	if len(s) <= n {
		return s
	}
	i := len(s) - max(n, 0)
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return s[i:]
}

// Ellipsis is s if it has at most n bytes, else its Head of n bytes and
// "…" (so up to n+3 bytes in all).
func Ellipsis(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return Head(s, n) + "…"
}
