package microvm

import (
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/testenv"
)

// The measured TSC frequency agrees with the kernel's calibration where
// /proc/cpuinfo gives that (a VM here): the measure is what a bare-metal
// host, whose "cpu MHz" is the clock of the moment, gets instead.
func TestMeasuredTSCMatchesTheKernels(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		testenv.Missing(t, "needs an x86 TSC")
	}
	flags := strings.Fields(cpuinfo("flags"))
	if !slices.Contains(flags, "constant_tsc") || (!slices.Contains(flags, "hypervisor") && slices.Contains(flags, "aperfmperf")) {
		testenv.Missing(t, "needs a host whose /proc/cpuinfo cpu MHz is its constant TSC's (a VM)")
	}
	mhz, err := strconv.ParseFloat(cpuinfo("cpu MHz"), 64)
	if err != nil {
		t.Fatal(err)
	}
	got := measureTSCkHz()
	t.Logf("measured %d kHz; the kernel says %.3f MHz", got, mhz)
	if d := math.Abs(float64(got)-mhz*1000) / (mhz * 1000); d > 0.002 {
		t.Errorf("measured %d kHz, the kernel says %.0f kHz: off by %.2f%%", got, mhz*1000, d*100)
	}
	if got%1000 != 0 {
		t.Errorf("measured %d kHz: not rounded to a MHz", got)
	}
	if k := hostTSCkHz(); k != int(mhz*1000) {
		t.Errorf("hostTSCkHz %d, want the kernel's %d on this host", k, int(mhz*1000))
	}
}
