package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// task create takes a cost budget in dollars, and warns when no ready
// node runs the task's driver (a task without one needs microvm, and
// `warren dev`'s node runs sim unless told otherwise): it would stay
// pending without a word.
func TestTaskCreateCostBudgetAndNoNodeWarning(t *testing.T) {
	live := inProcessServer(t)
	var out, errb bytes.Buffer
	if err := run([]string{"task", "create", "--repo", "https://git.example.com/a/b.git", "--base", "main", "--title", "t",
		"--max-cost", "2.5", "-o", "json", "--server", live}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	var task struct {
		Spec struct {
			Budgets struct {
				MaxCostMicroUsd string `json:"max_cost_micro_usd"`
			} `json:"budgets"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(out.Bytes(), &task); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if got := task.Spec.Budgets.MaxCostMicroUsd; got != "2500000" {
		t.Errorf("max_cost_micro_usd %q, want 2500000: %s", got, out.String())
	}
	if !strings.Contains(errb.String(), "warning: no ready node runs the microvm driver") {
		t.Errorf("stderr: %q", errb.String())
	}
	for _, bad := range []string{"-1", "x", "NaN", "1e9"} {
		if err := run([]string{"task", "create", "--repo", "https://git.example.com/a/b.git", "--base", "main", "--title", "t",
			"--max-cost", bad, "--server", live}, &out, &errb); err == nil || !strings.Contains(err.Error(), "max-cost") {
			t.Errorf("--max-cost %s: %v", bad, err)
		}
	}
}

// "warren task -h" and the other verb commands' help answer with the
// usage and succeed (they were "unknown verb").
func TestVerbCommandsHelp(t *testing.T) {
	for _, args := range [][]string{{"task", "-h"}, {"cluster", "--help"}, {"nodes", "help"}, {"pool", "-h"}, {"bench", "-h"}} {
		var out, errb bytes.Buffer
		if err := run(args, &out, &errb); err != nil || !strings.Contains(out.String(), "Usage:") {
			t.Errorf("warren %s: %v, %q", strings.Join(args, " "), err, out.String())
		}
	}
}
