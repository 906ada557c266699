package journal

import (
	"fmt"
	"os"
	"runtime/debug"

	"golang.org/x/sys/unix"
)

// fallocate allocates the first size bytes of f on disk.
func fallocate(f *os.File, size int64) error {
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		return fmt.Errorf("fallocate %s: %w", f.Name(), err)
	}
	return nil
}

// copyMapped copies src into dst, a part of a file mapping. The file's
// blocks are allocated when it is mapped, but a page can still fail to be
// read or written back (an I/O error): that raises SIGBUS, which this turns
// into an error instead of a crash.
func copyMapped(dst, src []byte) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("fault on the mapped segment: %v", r)
		}
	}()
	copy(dst, src)
	return nil
}
