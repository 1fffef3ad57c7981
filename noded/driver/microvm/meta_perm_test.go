package microvm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A sandbox's env (CreateSandboxRequest.env: where a sandbox's user puts
// its API keys) is saved in <state>/vms/<vm>/meta.json for re-adoption;
// no other user of the node's host may read it (the file is 0600, and
// New makes <state>/vms 0700).
func TestMetaWithEnvIsOwnerOnly(t *testing.T) {
	const secret = "sk-test-SECRET"
	dir := filepath.Join(t.TempDir(), "vms", "vm-1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	vm := &VM{id: "vm-1", sandboxID: "sb-1", state: "running", spec: vmSpec{Dir: dir}, env: map[string]string{"OPENAI_API_KEY": secret}}
	vm.save()
	name := filepath.Join(dir, "meta.json")
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), secret) {
		t.Fatal("meta.json does not hold the env: this test needs another way to find it")
	}
	st, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		t.Fatalf("meta.json holds the sandbox's env (%s) and has mode %v: readable by other users of the host", secret, st.Mode().Perm())
	}
}
