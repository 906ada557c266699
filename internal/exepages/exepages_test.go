package exepages

import (
	"strings"
	"testing"
)

const smaps = `00400000-01721000 r-xp 00000000 fd:01 4242                               /usr/bin/moonji (deleted)
Size:              19588 kB
Rss:               14136 kB
Anonymous:             0 kB
01721000-02bcc000 r--p 01321000 fd:01 4242                               /usr/bin/moonji (deleted)
Size:              21164 kB
Rss:               18092 kB
Anonymous:             0 kB
02bcc000-02d20000 rw-p 027cc000 fd:01 4242                               /usr/bin/moonji (deleted)
Size:               1360 kB
Rss:                 848 kB
Anonymous:           288 kB
02d20000-02d30000 r--p 02920000 fd:01 4242                               /usr/bin/moonji (deleted)
Size:                 64 kB
Rss:                  64 kB
Anonymous:             4 kB
37a540800000-37a541c00000 rw-p 00000000 00:00 0
Size:              20480 kB
Rss:               13308 kB
Anonymous:         13308 kB
7fda11b20000-7fda11c20000 r--p 00000000 fd:01 999                        /var/lib/moonji/journal/a b.journal
Size:               1024 kB
Rss:                 288 kB
Anonymous:             0 kB
7fda11c20000-7fda11c30000 r-xp 00000000 fd:02 4242                       /other/device/same/inode
Size:                 64 kB
Rss:                  64 kB
Anonymous:             0 kB
7fda11d00000-7fda11d10000 r--p 00000000 00:2a 77                         /usr/bin/moonji (deleted)
Size:                 64 kB
Rss:                  64 kB
Anonymous:             0 kB
7fda11d10000-7fda11d20000 r--p 00000000 00:2a 78                         /usr/bin/moonji
Size:                 64 kB
Rss:                  64 kB
Anonymous:             0 kB
7ffd1c5e4000-7ffd1c5e6000 r-xp 00000000 00:00 0                          [vdso]
Rss:                   8 kB
Anonymous:             0 kB
`

var exe = file{dev: "fd:01", inode: 4242, path: "/usr/bin/moonji (deleted)"}

// Only the executable's read-only mappings without a private copy of any
// page are chosen, found by device and inode or by path: not its data, not a
// read-only mapping with a copied page, not another file (the same inode on
// another device, the path without " (deleted)").
func TestReadOnlyFileMappings(t *testing.T) {
	got, err := readOnlyFileMappings(strings.NewReader(smaps), exe)
	if err != nil {
		t.Fatal(err)
	}
	want := []mapping{
		{start: 0x400000, end: 0x1721000, perms: "r-xp", dev: "fd:01", inode: 4242, path: "/usr/bin/moonji (deleted)", rss: 14136 << 10, clean: true},
		{start: 0x1721000, end: 0x2bcc000, perms: "r--p", dev: "fd:01", inode: 4242, path: "/usr/bin/moonji (deleted)", rss: 18092 << 10, clean: true},
		// Another device and inode (an overlay's lower layer), the same path.
		{start: 0x7fda11d00000, end: 0x7fda11d10000, perms: "r--p", dev: "00:2a", inode: 77, path: "/usr/bin/moonji (deleted)", rss: 64 << 10, clean: true},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d mappings, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("mapping %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

// A mapping whose Anonymous line is missing or unreadable is not known to
// be clean, and so is never chosen; nor is anything from a garbled header.
func TestReadOnlyFileMappingsHostile(t *testing.T) {
	for _, in := range []string{
		"00400000-01721000 r-xp 00000000 fd:01 4242 /x\nRss: 4 kB\n",
		"00400000-01721000 r-xp 00000000 fd:01 4242 /x\nRss: 4 kB\nAnonymous: lots kB\n",
		"00400000-01721000 r-xp 00000000 fd:01 4242 /x\nRss: 4 kB\nAnonymous: 0 MB\n",
		"01721000-00400000 r-xp 00000000 fd:01 4242 /x\nAnonymous: 0 kB\n",
		"zz-01721000 r-xp 00000000 fd:01 4242 /x\nAnonymous: 0 kB\n",
		"00400000-01721000 r-xp 00000000 fd01 4242 /x\nAnonymous: 0 kB\n",
		"00400000-01721000 r-xp 00000000 fd:01 -1 /x\nAnonymous: 0 kB\n",
		"00400000-01721000 r-xpx 00000000 fd:01 4242 /x\nAnonymous: 0 kB\n",
		"Anonymous: 0 kB\n",
		"00400000-01721000 r-xp 00000000 00:00 0\nAnonymous: 0 kB\n",
		"00400000-01721000 r-xp 00000000 fd:02 4242 /usr/bin/moonji\nAnonymous: 0 kB\n",
		"",
		strings.Repeat("x", 2<<20),
	} {
		got, err := readOnlyFileMappings(strings.NewReader(in), exe)
		if len(got) != 0 {
			t.Errorf("%.60q: chose %+v (err %v)", in, got, err)
		}
	}
}

func FuzzReadOnlyFileMappings(f *testing.F) {
	f.Add(smaps)
	f.Fuzz(func(t *testing.T, in string) {
		got, _ := readOnlyFileMappings(strings.NewReader(in), exe)
		for _, m := range got {
			if m.end <= m.start || strings.Contains(m.perms, "w") || !m.clean || !exe.is(&m) {
				t.Fatalf("chose %+v", m)
			}
		}
	})
}
