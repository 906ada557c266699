// Package models holds Moonji's database models and the queries on them.
// SQLite (pure Go) is the embedded default; PostgreSQL works the same way.
package models

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/glebarez/sqlite"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"moonji/internal/config"
)

// Open connects to the database named by a Moonji database URL
// (sqlite://PATH or postgres://…) and brings its schema up to date.
func Open(dbURL string) (*gorm.DB, error) {
	db, err := OpenUnmigrated(dbURL)
	if err != nil {
		return nil, err
	}
	if err := Migrate(db); err != nil {
		return nil, err
	}
	return db, nil
}

// OpenUnmigrated is Open without the migration, and without reaching the
// database: a server starting while PostgreSQL is away opens its pool this
// way, serves, and migrates once the database answers (web.Server).
func OpenUnmigrated(dbURL string) (*gorm.DB, error) {
	driver, dsn, err := config.DatabaseDriver(dbURL)
	if err != nil {
		return nil, err
	}
	gcfg := &gorm.Config{
		DisableAutomaticPing:   true,
		Logger:                 logger.Discard,
		SkipDefaultTransaction: true,
		NowFunc:                func() time.Time { return time.Now().UTC() },
	}
	var db *gorm.DB
	switch driver {
	case "sqlite":
		if dir := filepath.Dir(dsn); dir != "." && !strings.HasPrefix(dsn, ":memory:") && !strings.HasPrefix(dsn, "file:") {
			if err := os.MkdirAll(dir, 0o750); err != nil {
				return nil, fmt.Errorf("create database directory: %w", err)
			}
		}
		// WAL lets readers run beside the single writer; busy_timeout makes
		// a second process (the CLI beside a running server) wait instead of failing.
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		// wal_autocheckpoint(10000): the server's ledger checkpoints the WAL
		// every second on its own connection (ledger.checkpointEvery), so
		// that no request waits behind a checkpoint inside a commit; SQLite's
		// own, at 10000 pages (~40 MB) instead of 1000, is the safety net.
		// temp_store(MEMORY): a multi-row statement inside a transaction
		// keeps a statement journal, by default in a temporary file — two
		// more syscalls per row the ledger writes.
		// cache_size(-256): each connection caches at most 256 KiB of
		// pages, not SQLite's default 2 MB. A cached 4 KiB page and its
		// header take an 8 KiB slot of the allocator, so a busy
		// connection's full default cache was ~4 MB resident; and in WAL
		// mode a connection drops its whole cache when another one has
		// committed since its last read (the ledger commits several times
		// a second), so a large cache bought little. Measured: ~2–3 MB less
		// RSS at 1,000 req/s, the dashboards on a million rows unchanged.
		// _txlock=immediate: a transaction takes the write lock at BEGIN.
		// A deferred one that reads first (the search index's triggers do)
		// and then writes fails at once with "database is locked" when
		// another connection writes: busy_timeout cannot help a lock
		// upgrade. Every transaction here writes.
		// auto_vacuum(INCREMENTAL), first: it takes only on a database
		// with no table yet (a new one); retention then gives the pages
		// it frees back to the file system (IncrementalVacuum). An older
		// database keeps its mode until a VACUUM (README, Retention).
		dsn += sep + "_txlock=immediate&_pragma=auto_vacuum(INCREMENTAL)&_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)&_pragma=wal_autocheckpoint(10000)&_pragma=temp_store(MEMORY)&_pragma=cache_size(-256)"
		keepAllocatorPages()
		db, err = gorm.Open(sqlite.Open(dsn), gcfg)
	case "postgres":
		db, err = gorm.Open(postgres.Open(dsn), gcfg)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s database: %w", driver, err)
	}
	if err := setPool(db, driver); err != nil {
		return nil, err
	}
	return db, nil
}

// Reachable reports whether the database answers a ping within wait.
func Reachable(ctx context.Context, db *gorm.DB, wait time.Duration) bool {
	sqlDB, err := db.DB()
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return sqlDB.PingContext(ctx) == nil
}

// Connection pool sizes. database/sql keeps only 2 idle connections by
// default, so a burst closes and reopens connections all the time: on
// PostgreSQL each one forks a backend (240 new sessions in a 3.5 s stop
// benchmark), on SQLite each one reopens the file and reruns the pragmas.
const (
	// PostgreSQL: at most pgMaxOpen sessions per replica, all kept when idle
	// (three replicas fit in PostgreSQL's default max_connections of 100).
	pgMaxOpen = 32
	// SQLite: one writer at a time (WAL); readers in parallel, as many as
	// sqliteMaxOpen (more would not run sooner: SQLite runs in this
	// process's threads). Unbounded, a burst of 400 event streams left 383
	// descriptors on the database's files open for minutes; each
	// connection holds three (the database, its WAL, its shared memory).
	// A burst's extra connections close as soon as it is over: only
	// sqliteMaxIdle stay.
	sqliteMaxOpen = 16
	sqliteMaxIdle = 4
	// An idle connection is closed after this long, so a quiet replica
	// gives its sessions back.
	maxIdleTime = 5 * time.Minute
)

func setPool(db *gorm.DB, driver string) error {
	sqlDB, err := db.DB()
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	switch driver {
	case "postgres":
		sqlDB.SetMaxOpenConns(pgMaxOpen)
		sqlDB.SetMaxIdleConns(pgMaxOpen)
	case "sqlite":
		sqlDB.SetMaxOpenConns(sqliteMaxOpen)
		sqlDB.SetMaxIdleConns(sqliteMaxIdle)
	}
	sqlDB.SetConnMaxIdleTime(maxIdleTime)
	return nil
}

// Migrate creates or updates every table, then the indexes AutoMigrate
// cannot make (search.go).
func Migrate(db *gorm.DB) error {
	if err := addMessageParents(db); err != nil {
		return err
	}
	if err := db.AutoMigrate(&User{}, &APIKey{}, &Usage{}, &Replica{}, &Session{}, &LoginState{}, &Conversation{}, &Message{},
		&UsageRollup{}, &UsageByPerson{}, &UsageOfPerson{}, &UsageLatency{}, &Team{}, &TeamMember{}, &Share{}, &Attachment{}, &AuditEvent{}, &Progress{}); err != nil {
		return fmt.Errorf("migrate schema: %w", err)
	}
	if err := dropUsageIndexes(db); err != nil {
		return err
	}
	if err := backfillRollup(context.Background(), db, backfillBatch); err != nil {
		return err
	}
	if err := migrateConversationIndexes(db); err != nil {
		return err
	}
	if err := migrateAudit(db); err != nil {
		return err
	}
	return migrateSearch(db)
}

// Close closes the database's connection pool.
func Close(db *gorm.DB) {
	sqlDB, err := db.DB()
	if err != nil {
		return
	}
	if err := sqlDB.Close(); err != nil {
		slog.Warn("close database", "err", err)
	}
}
