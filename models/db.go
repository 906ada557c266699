// Package models holds Moonji's database models and the queries on them.
// SQLite (pure Go) is the embedded default; PostgreSQL works the same way.
package models

import (
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
	driver, dsn, err := config.DatabaseDriver(dbURL)
	if err != nil {
		return nil, err
	}
	gcfg := &gorm.Config{
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
		dsn += sep + "_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)"
		db, err = gorm.Open(sqlite.Open(dsn), gcfg)
	case "postgres":
		db, err = gorm.Open(postgres.Open(dsn), gcfg)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s database: %w", driver, err)
	}
	if err := Migrate(db); err != nil {
		return nil, err
	}
	return db, nil
}

// Migrate creates or updates every table.
func Migrate(db *gorm.DB) error {
	if err := db.AutoMigrate(&User{}, &APIKey{}, &Usage{}, &Replica{}, &Session{}, &LoginState{}); err != nil {
		return fmt.Errorf("migrate schema: %w", err)
	}
	return nil
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
