package driver

import (
	"os/exec"
	"testing"
)

func TestShellQuote(t *testing.T) {
	for _, s := range []string{"", "plain", "two words", "it's", "'", `a"b$c\d`, "$(rm -rf /)", "new\nline"} {
		out, err := exec.Command("/bin/sh", "-c", "printf %s "+ShellQuote(s)).Output()
		if err != nil || string(out) != s {
			t.Errorf("ShellQuote(%q): the shell read %q (%v)", s, out, err)
		}
	}
}
