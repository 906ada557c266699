// Package exepages lets go of the executable's pages that only start-up
// touched.
//
// A Go binary maps its code and read-only data from the executable file.
// Every page a process has touched stays mapped, and counts in its resident
// memory, until the kernel needs the memory back. Moonji's start-up touches
// most of its 40 MB of code and read-only data once: package initialisers
// (syntax highlighters' lexers, HTML tables, OIDC, SQL drivers), the
// migrations, the templates. A serving gateway uses a small part of it. At
// 1,000 req/s the binary's pages were 28–33 MB of a 52–56 MB RSS
// (BENCHMARKS.md §21–24).
//
// Release unmaps those pages from the process with madvise(MADV_DONTNEED)
// once the server is up. They stay in the kernel's page cache, so a page
// that is used again comes back on its first touch as a minor fault, from
// memory, with no disk read; what is never touched again no longer counts
// against the process and is freed first when memory runs short (a page
// freed that way and needed later is read from disk again, as any page of a
// program that has not run for a while may be). Only mappings of the
// executable that are read-only and hold no private copy of any page
// (smaps' Anonymous: 0) are advised: for them the file's contents and the
// process's view are the same bytes, so dropping the mapping loses nothing.
// A writable or copied-on-write page is never touched.
package exepages

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// mapping is one region of a process's address space, from smaps.
type mapping struct {
	start, end uint64
	perms      string
	dev        string // major:minor, in hex, as smaps prints it
	inode      uint64
	path       string
	rss        int64 // bytes
	clean      bool  // smaps said Anonymous: 0 kB
}

// file names the executable as smaps shows it: by device and inode, and by
// path. Either is enough: on an overlay file system (a container's) the
// mappings show the lower layer's device and inode, which stat of
// /proc/self/exe does not.
type file struct {
	dev   string // major:minor, in hex
	inode uint64
	path  string // as /proc/self/exe reads, " (deleted)" included
}

func (f file) is(m *mapping) bool {
	return (m.dev == f.dev && m.inode == f.inode) || (f.path != "" && m.path == f.path)
}

// readOnlyFileMappings parses smaps and returns the mappings of exe that
// are not writable and hold no anonymous page.
func readOnlyFileMappings(smaps io.Reader, exe file) ([]mapping, error) {
	var out []mapping
	var cur *mapping
	flush := func() {
		if cur != nil && exe.is(cur) && !strings.Contains(cur.perms, "w") && cur.clean {
			out = append(out, *cur)
		}
		cur = nil
	}
	sc := bufio.NewScanner(smaps)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if m, ok := parseHeader(line); ok {
			flush()
			cur = &m
			continue
		}
		if cur == nil {
			continue
		}
		if v, ok := field(line, "Rss:"); ok {
			cur.rss = v
		} else if bytes.HasPrefix(line, []byte("Anonymous:")) {
			// An unreadable value is not known to be 0: not clean.
			v, ok := field(line, "Anonymous:")
			cur.clean = ok && v == 0
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read smaps: %w", err)
	}
	flush()
	return out, nil
}

// parseHeader parses a mapping's first line in smaps:
//
//	00400000-01721000 r-xp 00000000 fd:01 1234567   /usr/bin/moonji (deleted)
//
// The path, the rest of the line, may hold spaces or be absent.
func parseHeader(line []byte) (mapping, bool) {
	f := bytes.Fields(line)
	if len(f) < 5 {
		return mapping{}, false
	}
	addr := bytes.IndexByte(f[0], '-')
	if addr <= 0 || len(f[1]) != 4 || bytes.IndexByte(f[3], ':') <= 0 {
		return mapping{}, false
	}
	start, err1 := strconv.ParseUint(string(f[0][:addr]), 16, 64)
	end, err2 := strconv.ParseUint(string(f[0][addr+1:]), 16, 64)
	inode, err3 := strconv.ParseUint(string(f[4]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || end <= start {
		return mapping{}, false
	}
	// The path is what follows the fifth field.
	path := ""
	if len(f) > 5 {
		rest := line
		for range 5 {
			rest = bytes.TrimLeft(rest, " \t")
			rest = rest[bytes.IndexAny(rest, " \t"):]
		}
		path = string(bytes.TrimLeft(rest, " \t"))
	}
	return mapping{start: start, end: end, perms: string(f[1]), dev: string(f[3]), inode: inode, path: path}, true
}

// field reads a "Name:   123 kB" line of smaps, in bytes.
func field(line []byte, name string) (int64, bool) {
	rest, ok := bytes.CutPrefix(line, []byte(name))
	if !ok {
		return 0, false
	}
	f := bytes.Fields(rest)
	if len(f) != 2 || string(f[1]) != "kB" {
		return 0, false
	}
	v, err := strconv.ParseInt(string(f[0]), 10, 64)
	if err != nil {
		return 0, false
	}
	return v << 10, true
}
