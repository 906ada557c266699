package exepages

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Release drops the executable's read-only pages from the process (see the
// package comment) and returns how many bytes of them were resident before.
// Pages used afterwards come back on their own, from the page cache.
func Release() (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return 0, fmt.Errorf("stat the executable: %w", err)
	}
	exe := file{dev: fmt.Sprintf("%02x:%02x", unix.Major(st.Dev), unix.Minor(st.Dev)), inode: st.Ino}
	exe.path, _ = os.Readlink("/proc/self/exe")
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, fmt.Errorf("open smaps: %w", err)
	}
	maps, err := readOnlyFileMappings(f, exe)
	f.Close()
	if err != nil {
		return 0, err
	}
	var released int64
	for _, m := range maps {
		// The raw call: unix.Madvise wants the region as a []byte.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(m.start), uintptr(m.end-m.start), unix.MADV_DONTNEED); errno != 0 {
			return released, fmt.Errorf("madvise %x-%x: %w", m.start, m.end, errno)
		}
		released += m.rss
	}
	return released, nil
}
