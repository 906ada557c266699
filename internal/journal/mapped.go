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

// populateWrite faults in b, a part of a shared file mapping, writable, as
// if each page were written (MADV_POPULATE_WRITE, Linux 5.14+; older
// kernels answer EINVAL), without changing a byte.
func populateWrite(b []byte) error {
	if err := unix.Madvise(b, unix.MADV_POPULATE_WRITE); err != nil {
		return fmt.Errorf("madvise(MADV_POPULATE_WRITE): %w", err)
	}
	return nil
}
