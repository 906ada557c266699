package sysmon

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestEnviron(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     []string
		want    []string
		changed bool
	}{
		{"no GODEBUG", []string{"A=1"}, []string{"A=1", "GODEBUG=" + Setting}, true},
		{"empty", nil, []string{"GODEBUG=" + Setting}, true},
		{"empty GODEBUG", []string{"GODEBUG=", "B=2"}, []string{"GODEBUG=" + Setting, "B=2"}, true},
		{"other settings kept", []string{"GODEBUG=gctrace=1,madvdontneed=1"},
			[]string{"GODEBUG=gctrace=1,madvdontneed=1," + Setting}, true},
		{"the operator's schedtrace stands", []string{"GODEBUG=schedtrace=0"}, []string{"GODEBUG=schedtrace=0"}, false},
		{"among others", []string{"X=y", "GODEBUG=gctrace=1,schedtrace=1000"}, []string{"X=y", "GODEBUG=gctrace=1,schedtrace=1000"}, false},
		// The runtime does not trim spaces: " schedtrace" is not its setting.
		{"after a space", []string{"GODEBUG=gctrace=1, schedtrace=0"}, []string{"GODEBUG=gctrace=1, schedtrace=0," + Setting}, true},
		{"already added", []string{"GODEBUG=" + Setting}, []string{"GODEBUG=" + Setting}, false},
		{"a name that only ends like it", []string{"NOTGODEBUG=schedtrace=0"}, []string{"NOTGODEBUG=schedtrace=0", "GODEBUG=" + Setting}, true},
		{"a value that only contains it", []string{"GODEBUG=xschedtrace=0"}, []string{"GODEBUG=xschedtrace=0," + Setting}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig := slices.Clone(tc.env)
			got, changed := Environ(tc.env)
			if !slices.Equal(got, tc.want) || changed != tc.changed {
				t.Errorf("Environ(%q) = %q, %v; want %q, %v", tc.env, got, changed, tc.want, tc.changed)
			}
			if !slices.Equal(tc.env, orig) {
				t.Errorf("Environ changed its argument: %q, was %q", tc.env, orig)
			}
		})
	}
}

// TestKeepAwakeRunsTheProgramAgain runs this test binary as a helper that
// calls KeepAwake, and checks that the helper ended up running in the same
// process with the setting in its environment — or, when the operator set
// schedtrace, with theirs.
func TestKeepAwakeRunsTheProgramAgain(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("KeepAwake does nothing here")
	}
	for _, tc := range []struct {
		godebug, want string
	}{
		{"", Setting},
		{"gctrace=0", "gctrace=0," + Setting},
		{"schedtrace=0", "schedtrace=0"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKeepAwakeHelper$", "-test.v")
		cmd.Env = append(os.Environ(), "MOONJI_SYSMON_HELPER=1", "GODEBUG="+tc.godebug)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helper with GODEBUG=%q: %v\n%s", tc.godebug, err, out)
		}
		var pid, runs int
		var godebug, comm string
		for line := range strings.Lines(string(out)) {
			if v, ok := strings.CutPrefix(line, "helper: "); ok {
				if _, err := fmt.Sscanf(v, "pid=%d runs=%d godebug=%q comm=%q", &pid, &runs, &godebug, &comm); err != nil {
					t.Fatalf("helper said %q: %v", v, err)
				}
			}
		}
		if pid != cmd.Process.Pid {
			t.Errorf("GODEBUG=%q: the helper ran as pid %d, want %d (the same process)\n%s", tc.godebug, pid, cmd.Process.Pid, out)
		}
		if godebug != tc.want {
			t.Errorf("GODEBUG=%q: the helper ran with GODEBUG=%q, want %q", tc.godebug, godebug, tc.want)
		}
		// Run as /proc/self/exe, the process would be named "exe".
		if want := filepath.Base(os.Args[0]); comm != want[:min(len(want), 15)] {
			t.Errorf("GODEBUG=%q: the helper is named %q, want %q", tc.godebug, comm, want)
		}
		wantRuns := 2
		if tc.want == tc.godebug {
			wantRuns = 1
		}
		if runs != wantRuns {
			t.Errorf("GODEBUG=%q: the helper started %d times, want %d", tc.godebug, runs, wantRuns)
		}
	}
}

func TestKeepAwakeHelper(t *testing.T) {
	if os.Getenv("MOONJI_SYSMON_HELPER") != "1" {
		t.Skip("run by TestKeepAwakeRunsTheProgramAgain")
	}
	// Count the starts in the environment, which survives the exec.
	runs, _ := strconv.Atoi(os.Getenv("MOONJI_SYSMON_RUNS"))
	runs++
	os.Setenv("MOONJI_SYSMON_RUNS", strconv.Itoa(runs))
	if runs > 2 {
		t.Fatal("KeepAwake ran the program again more than once")
	}
	if err := KeepAwake(); err != nil {
		t.Fatal(err)
	}
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("helper: pid=%d runs=%d godebug=%q comm=%q\n", os.Getpid(), runs, os.Getenv("GODEBUG"), strings.TrimSpace(string(comm)))
}
