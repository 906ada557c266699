package models

import (
	"sync"

	"modernc.org/libc"
)

// The embedded SQLite is C translated to Go; its malloc is modernc's
// allocator, which carves each size class (16 B … 16 KiB) out of 64 KiB
// pages it maps with mmap, and unmaps a page the moment its last slot is
// freed. SQLite frees everything a statement allocated when the statement
// ends — its program, its registers, the 1 KiB chunks of its statement
// journal — so under a steady write load the same few pages were mapped
// and unmapped for every statement: munmap (with its TLB shootdown on a
// multi-threaded process) was a quarter of the ledger writer's CPU.
//
// keepAllocatorPages holds one slot in each of a few pages of every size
// class for the life of the process, so those pages are never empty and
// stay mapped; the slots freed around the held one serve the next
// statement. It is glibc's M_TRIM_THRESHOLD, done from outside. The cost is
// the held pages: keptPages of each class, and keptCachePages of the 8 KiB
// class, which holds SQLite's page cache (a connection drops its cache when
// another one wrote, and reads the pages back into fresh slots): 3.5 MB.
const (
	keptPages      = 4
	keptCachePages = 16
)

var keepPagesOnce sync.Once

func keepAllocatorPages() {
	keepPagesOnce.Do(func() {
		tls := libc.NewTLS()
		defer tls.Close()
		const pageSize = 64 << 10
		for log := 4; log <= 14; log++ {
			size := 1 << log
			perPage := pageSize / size
			var slots []uintptr
			kept := keptPages
			if log == 13 {
				kept = keptCachePages
			}
			for range kept * perPage {
				p := libc.Xmalloc(tls, libc.Tsize_t(size))
				if p == 0 {
					break
				}
				slots = append(slots, p)
			}
			held := map[uintptr]bool{}
			for _, p := range slots {
				page := p &^ (pageSize - 1)
				if !held[page] {
					held[page] = true // never freed
					continue
				}
				libc.Xfree(tls, p)
			}
		}
	})
}
