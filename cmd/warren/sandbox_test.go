package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/noded"
)

// Bad sandbox and task flags are refused before any call, naming the
// flag: a TTL below 0, values that would wrap in the API's 32-bit fields,
// and input over the API's limits (not read whole into memory first).
func TestSandboxFlagErrors(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(big, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, noded.MaxFileBytes+1); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sandbox", "create", "--ttl", "-1s"}, "ttl -1s: must not be negative"},
		{[]string{"sandbox", "create", "--memory-mb", "4294967424"}, "memory-mb 4294967424: over 4294967295"},
		{[]string{"sandbox", "create", "--vcpus", "4294967296"}, "vcpus 4294967296: over"},
		{[]string{"sandbox", "cp", big, "sb-0000000000-dev:/x"}, "over the limit of 33554432"},
		{[]string{"sandbox", "exec", "--cmd-timeout", "-1s", "sb-0000000000-dev", "--", "true"}, "--cmd-timeout -1s: must not be negative"},
		{[]string{"task", "create", "--repo", "https://example.com/r.git", "--base", "main", "--title", "t",
			"--script-steps", "1", "--script-step-millis", "4294967496"}, "script-step-millis 4294967496: over 4294967295"},
		{[]string{"task", "create", "--repo", "https://example.com/r.git", "--base", "main", "--title", "t",
			"--script-steps", "1", "--script-output-bytes", "4294967297"}, "script-output-bytes 4294967297: over"},
	} {
		var out, errOut bytes.Buffer
		err := run(c.args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("warren %s: error %v, want it to say %q", strings.Join(c.args, " "), err, c.want)
		}
	}
}

func TestReadAtMost(t *testing.T) {
	if b, err := readAtMost(strings.NewReader("12345"), 5, "stdin"); err != nil || string(b) != "12345" {
		t.Errorf("at the limit: %q %v", b, err)
	}
	if _, err := readAtMost(strings.NewReader("123456"), 5, "stdin"); err == nil || !strings.Contains(err.Error(), "stdin: over the limit of 5 bytes") {
		t.Errorf("over the limit: %v", err)
	}
}
