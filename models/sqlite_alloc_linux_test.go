package models

import (
	"syscall"
	"testing"
	"unsafe"

	"modernc.org/libc"
)

// After keepAllocatorPages, freeing the last block a statement had in a
// page leaves the page mapped: the next statement's blocks reuse it
// instead of a fresh mmap (and the munmap before it).
func TestKeptAllocatorPagesStayMapped(t *testing.T) {
	keepAllocatorPages()
	tls := libc.NewTLS()
	defer tls.Close()
	for _, size := range []int{48, 1032, 4200, 8300, 16000} {
		var blocks []uintptr
		for range 8 { // fewer than the kept slots of the largest class (4 pages × 3)
			blocks = append(blocks, libc.Xmalloc(tls, libc.Tsize_t(size)))
		}
		for _, p := range blocks {
			libc.Xfree(tls, p)
		}
		for _, p := range blocks {
			page := p &^ (64<<10 - 1)
			// mincore fails with ENOMEM on an address that is not mapped.
			var vec [1]byte
			if _, _, errno := syscall.Syscall(syscall.SYS_MINCORE, page, 4096, uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
				t.Fatalf("size %d: the page of a freed block was unmapped (mincore: %v)", size, errno)
			}
		}
	}
}
