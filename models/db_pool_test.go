package models

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// TestSQLitePoolIsBounded: a burst of concurrent queries (a person opening
// hundreds of event streams, each reading the database) holds at most 16
// connections, and once it is over at most 4 stay open: the review saw 383
// descriptors on the database's files left open for minutes after such a
// burst.
func TestSQLitePoolIsBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	db, err := Open("sqlite://" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(db)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// 40 readers at once, each holding its connection until all have
	// asked: only the pool's bound get one meanwhile.
	const readers = 40
	var wg sync.WaitGroup
	var mu sync.Mutex
	held := 0
	release := make(chan struct{})
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := sqlDB.Conn(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			var n int
			if err := conn.QueryRowContext(ctx, "SELECT count(*) FROM users").Scan(&n); err != nil {
				t.Error(err)
			}
			mu.Lock()
			held++
			mu.Unlock()
			<-release
		}()
	}
	// Wait until every reader holds a connection or waits for one.
	for {
		mu.Lock()
		h := held
		mu.Unlock()
		if st := sqlDB.Stats(); h+int(st.WaitCount) >= readers || h == readers {
			break
		}
		runtime.Gosched()
	}
	mu.Lock()
	atOnce := held
	mu.Unlock()
	close(release)
	wg.Wait()
	if atOnce > 16 {
		t.Errorf("%d of %d readers held a connection at once, want at most 16", atOnce, readers)
	}
	st := sqlDB.Stats()
	if st.MaxOpenConnections == 0 || st.MaxOpenConnections > 16 {
		t.Fatalf("the pool's bound is %d, want 1 to 16", st.MaxOpenConnections)
	}
	if st.OpenConnections > 4 {
		t.Errorf("%d connections open after the burst, want at most 4", st.OpenConnections)
	}
	if runtime.GOOS == "linux" {
		// SQLite keeps a closed connection's descriptors while others
		// hold locks on the file, for the next connection to take over
		// (unixClose's unused list): what stays is bounded by the most
		// connections ever open at once, three descriptors each.
		if n := openFilesUnder(t, path); n > 3*16 {
			t.Errorf("%d descriptors on the database's files after the burst, want at most %d", n, 3*16)
		}
	}
}

// openFilesUnder counts this process's descriptors on path and its
// siblings (-wal, -shm).
func openFilesUnder(t *testing.T, path string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.HasPrefix(target, path) {
			n++
		}
	}
	return n
}
