// Package testcpu runs a test again in a child process confined to one
// CPU, where Go starts with GOMAXPROCS 1: the case the gateway's one-core
// tuning (spareproc) is for, which a test process on a larger machine never
// sees by itself.
package testcpu

import (
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const envChild = "MOONJI_TESTCPU_CHILD"

// OnOne reports whether the calling test runs in the child. In the child,
// which has one CPU, it returns true and the test does its work there. In
// the parent it runs the child (the same test binary, only this test), fails
// the test if the child failed, and returns false: the test then returns.
// Only top-level tests can be run again this way. The test is skipped where
// the child cannot be confined (not Linux, no taskset).
func OnOne(t *testing.T) bool {
	t.Helper()
	if os.Getenv(envChild) == t.Name() {
		if n := runtime.GOMAXPROCS(0); n != 1 {
			t.Fatalf("the child was to have GOMAXPROCS 1, has %d", n)
		}
		return true
	}
	if runtime.GOOS != "linux" {
		t.Skip("confining a process to one CPU is done with taskset, on Linux")
	}
	taskset, err := exec.LookPath("taskset")
	if err != nil {
		t.Skip("taskset (util-linux) is not installed")
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatalf("read this process's CPUs: %v", err)
	}
	cpu := -1
	for i := 0; i < 1024 && cpu < 0; i++ {
		if set.IsSet(i) {
			cpu = i
		}
	}
	if cpu < 0 {
		t.Fatal("this process may run on no CPU")
	}
	cmd := exec.Command(taskset, "-c", strconv.Itoa(cpu), os.Args[0],
		"-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envChild+"="+t.Name())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the test on one CPU failed: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()+" ") {
		t.Fatalf("the test did not pass on one CPU (skipped, or not run):\n%s", out)
	}
	t.Logf("on one CPU:\n%s", out)
	return false
}

// WaitForOneP waits, in the child, until GOMAXPROCS is 1 again: until a P
// lent to the process (spareproc) was taken back.
func WaitForOneP(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.GOMAXPROCS(0) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("GOMAXPROCS stayed %d", runtime.GOMAXPROCS(0))
		}
		time.Sleep(time.Millisecond)
	}
}
