package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// task create's --cpu and --memory set spec.resources, which placement
// reserves and the task's sandbox is claimed with; bad values are refused
// naming the flag, before any call.
func TestTaskCreateResources(t *testing.T) {
	server := inProcessServer(t)
	base := []string{"task", "create", "--repo", "https://git.example.com/a/b.git", "--base", "main", "--title", "t", "--server", server}
	var out, errb bytes.Buffer
	if err := run(append(base, "--cpu", "1.5", "--memory", "1GiB", "-o", "json"), &out, &errb); err != nil {
		t.Fatalf("create: %v %s", err, errb.String())
	}
	var task struct {
		ID   string `json:"id"`
		Spec struct {
			Resources struct {
				MilliCPU    json.Number `json:"milli_cpu"`
				MemoryBytes json.Number `json:"memory_bytes"`
			} `json:"resources"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(out.Bytes(), &task); err != nil {
		t.Fatalf("create -o json printed %q: %v", out.String(), err)
	}
	if r := task.Spec.Resources; r.MilliCPU != "1500" || r.MemoryBytes != "1073741824" {
		t.Fatalf("spec.resources = %+v, want 1500m and 1 GiB\n%s", r, out.String())
	}
	id := task.ID
	out.Reset()
	if err := run([]string{"task", "get", id, "--server", server}, &out, &errb); err != nil || !strings.Contains(out.String(), "cpu 1.5, memory 1024MiB") {
		t.Fatalf("task get: %v\n%s", err, out.String())
	}
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--cpu", "0"}, `invalid value "0" for flag -cpu: "0" is not a number of cores from 0.001 to 1024`},
		{[]string{"--cpu", "NaN"}, "flag -cpu"},
		{[]string{"--memory", "64MiB"}, `invalid value "64MiB" for flag -memory: 64MiB is not from 128MiB to 64GiB`},
		{[]string{"--memory", "lots"}, "flag -memory: not a positive size like 512MiB"},
	} {
		out.Reset()
		errb.Reset()
		err := run(append(base, c.flags...), &out, &errb)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.flags, err, c.want)
		}
	}
}
