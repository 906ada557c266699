package exepages

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// rssFile is the process's resident file-backed memory, in bytes.
func rssFile(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "RssFile:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// Release drops the test binary's start-up pages from its resident memory,
// and the process goes on running the code it dropped.
func TestRelease(t *testing.T) {
	before := rssFile(t)
	released, err := Release()
	if err != nil {
		t.Fatal(err)
	}
	after := rssFile(t)
	t.Logf("RssFile %d → %d KiB; %d KiB of the executable's pages released", before>>10, after>>10, released>>10)
	if released < 1<<20 {
		t.Errorf("released %d bytes; a Go test binary has megabytes of its pages resident", released)
	}
	// What the test itself runs next (reading /proc, the runtime) comes
	// back at once, with the kernel's fault-around of 64 KiB a fault.
	if after > before-released/4 {
		t.Errorf("RssFile %d → %d bytes after releasing %d", before, after, released)
	}
	// The code and data the test uses come back on their own.
	if _, err := readOnlyFileMappings(strings.NewReader(smaps), exe); err != nil {
		t.Fatal(err)
	}
	if again, err := Release(); err != nil || again >= released {
		t.Errorf("a second Release: %d bytes resident (first %d), err %v", again, released, err)
	}
}
