package models

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Outcomes of a request in the usage ledger.
const (
	OutcomePending   = "pending" // still running; closed at start-up after a crash
	OutcomeSuccess   = "success"
	OutcomeError     = "error"
	OutcomeCancelled = "cancelled"
	OutcomeStopped   = "stopped"
	OutcomeRejected  = "rejected"
)

// Where a row's token counts came from.
const (
	UsageFromEngine  = "engine"  // the engine's usage object
	UsageFromCounted = "counted" // counted from delivered chunks (stream cut short)
	// UsageEstimated: the engine never said; the prompt's tokens are
	// estimated from its text (and the completion counted from chunks).
	UsageEstimated = "estimated"
	UsageNone      = "none"
)

// Usage is one row of the ledger: exactly one per inference request.
type Usage struct {
	InferenceID string `gorm:"primaryKey;size:40"`
	// Every index here is one more B-tree the ledger writes for every row
	// (rebalancing the right edges of seven of them was ~40 % of the SQLite
	// writer's CPU at 1,000 req/s), so each serves a
	// query that needs it; TestUsageIndexes pins the set.
	//
	// Outcome and CreatedAt are indexed together for the dashboards'
	// "recent rejections" and "recent errors" (newest rows of an outcome)
	// and for the pending rows of a vanished replica (CloseUnfinishedUsage).
	CreatedAt  time.Time `gorm:"index;index:idx_usage_outcome_created,priority:2;index:idx_usage_user_created,priority:2"`
	FinishedAt *time.Time
	// UserID and CreatedAt: one person's export (EachUsageOf).
	UserID *uint  `gorm:"index:idx_usage_user_created,priority:1"`
	User   string `gorm:"size:320"`
	// KeyID is not indexed: the dashboards count keys in the rollup tables.
	KeyID  *uint
	Source string `gorm:"size:8"`
	// API is the endpoint: chat, completions, embeddings or responses.
	API   string `gorm:"size:16"`
	Model string `gorm:"size:200"`
	// Backend is the backend that served the request (for one refused
	// while queued, the model's backends, comma-separated).
	Backend string `gorm:"size:200"`
	// RetriedFrom is the backend that failed the request before its answer
	// started, when it was retried on Backend; empty otherwise.
	RetriedFrom string `gorm:"size:200"`
	// ResponseID is a Responses API request's response id (the engine's,
	// or resp_ and the inference id for a translated one), so that GET,
	// DELETE and cancel on /v1/responses/{id} find the request's owner and
	// backend. Only those rows are in its index (UsageByResponseID).
	ResponseID       string `gorm:"size:100;index:idx_usage_response_id,where:response_id <> ''"`
	Outcome          string `gorm:"size:16;index:idx_usage_outcome_created,priority:1"`
	Status           int
	Reason           string `gorm:"size:200"`
	PromptTokens     int
	CompletionTokens int
	// CachedTokens are those of PromptTokens the engine served from its
	// cache (prompt_tokens_details.cached_tokens), billed at the model's
	// cached price.
	CachedTokens int
	// Cost is what the row's tokens cost at its model's price when it was
	// made final, in nano-units of the deployment's currency (money); 0 for
	// a free model and for every rejected request. A later price change
	// never rewrites it.
	Cost        int64
	UsageSource string `gorm:"size:16"`
	QueueMs     int64
	TTFTMs      *int64
	DurationMs  int64
	// Replica is the gateway replica that served the request, so that a
	// restarted or vanished replica's unfinished rows can be closed without
	// touching those its siblings are still serving. Not indexed: the
	// few pending rows are found through idx_usage_outcome_created.
	Replica string `gorm:"size:200"`
}

// usageIndexesDropped are indexes of usages earlier versions made and no
// query needs: key_id and replica are not looked up in the ledger, user_id
// alone became idx_usage_user_created, and response_id for every row
// became idx_usage_response_id for the Responses rows only.
var usageIndexesDropped = []string{"idx_usages_key_id", "idx_usages_replica", "idx_usages_user_id", "idx_usages_response_id"}

// dropUsageIndexes drops usageIndexesDropped where they exist, so that an
// upgraded ledger writes no more B-trees per row than a new one.
func dropUsageIndexes(db *gorm.DB) error {
	m := db.Migrator()
	for _, name := range usageIndexesDropped {
		if !m.HasIndex(&Usage{}, name) {
			continue
		}
		if err := m.DropIndex(&Usage{}, name); err != nil {
			return fmt.Errorf("drop index %s: %w", name, err)
		}
	}
	return nil
}

// Sanitize makes every string column storable, whatever a client sent: a
// row PostgreSQL refuses (a value longer than its column, a NUL byte,
// invalid UTF-8) is a request whose inference id has no row. Invalid bytes
// become U+FFFD, C0 control characters (NUL, tab, newline, escape, …) are
// dropped, and each value is cut to its column's size in characters, the
// unit of PostgreSQL's varchar(n). The sizes are those of the gorm tags
// above; a test keeps the two in step.
func (u *Usage) Sanitize() {
	u.InferenceID = Storable(u.InferenceID, 40)
	u.User = Storable(u.User, 320)
	u.Source = Storable(u.Source, 8)
	u.API = Storable(u.API, 16)
	u.Model = Storable(u.Model, 200)
	u.Backend = Storable(u.Backend, 200)
	u.RetriedFrom = Storable(u.RetriedFrom, 200)
	u.ResponseID = Storable(u.ResponseID, 100)
	u.Outcome = Storable(u.Outcome, 16)
	u.Reason = Storable(u.Reason, 200)
	u.UsageSource = Storable(u.UsageSource, 16)
	u.Replica = Storable(u.Replica, 200)
}

// Storable returns s as valid UTF-8 without C0 control characters, cut to
// at most size characters (never inside one). A value that is already so is
// returned as it is, without allocating.
func Storable(s string, size int) string {
	clean := true
	n := 0
	for _, r := range s {
		// A range over a string yields U+FFFD for each invalid byte; a
		// real U+FFFD is rare enough to take the slow path too.
		if r < 0x20 || r == utf8.RuneError {
			clean = false
			break
		}
		n++
	}
	if clean && n <= size {
		return s
	}
	var b strings.Builder
	b.Grow(min(len(s), size*utf8.UTFMax))
	n = 0
	for _, r := range strings.ToValidUTF8(s, string(utf8.RuneError)) {
		if r < 0x20 {
			continue
		}
		if n == size {
			break
		}
		b.WriteRune(r)
		n++
	}
	return b.String()
}

// Replica is a running gateway replica's heartbeat.
type Replica struct {
	ID        string `gorm:"primaryKey;size:200"`
	StartedAt time.Time
	SeenAt    time.Time `gorm:"index"`
	// ConfigVersion is the version of the configuration the replica runs
	// (reload.Version's id), so that the admin page shows a mismatch.
	ConfigVersion  string `gorm:"size:64"`
	ConfigLoadedAt *time.Time
}

// SetReplicaConfig records the configuration version replica id runs; the
// replica's row exists (Heartbeat made it).
func SetReplicaConfig(ctx context.Context, db *gorm.DB, id, version string, loaded time.Time) error {
	err := db.WithContext(ctx).Model(&Replica{}).Where("id = ?", id).
		Updates(map[string]any{"config_version": version, "config_loaded_at": loaded.UTC()}).Error
	if err != nil {
		return fmt.Errorf("record replica %s's configuration version: %w", id, err)
	}
	return nil
}

// LiveReplicas lists the replicas seen since since, by id.
func LiveReplicas(ctx context.Context, db *gorm.DB, since time.Time) ([]Replica, error) {
	var out []Replica
	if err := db.WithContext(ctx).Where("seen_at >= ?", since.UTC()).Order("id").Limit(1000).Find(&out).Error; err != nil {
		return nil, fmt.Errorf("list live replicas: %w", err)
	}
	return out, nil
}

// Heartbeat records that replica id is alive.
func Heartbeat(ctx context.Context, db *gorm.DB, id string, started time.Time) error {
	now := time.Now().UTC()
	res := db.WithContext(ctx).Model(&Replica{}).Where("id = ?", id).Update("seen_at", now)
	if res.Error != nil {
		return fmt.Errorf("replica heartbeat: %w", res.Error)
	}
	if res.RowsAffected > 0 {
		return nil
	}
	if err := db.WithContext(ctx).Create(&Replica{ID: id, StartedAt: started.UTC(), SeenAt: now}).Error; err != nil {
		return fmt.Errorf("register replica %s: %w", id, err)
	}
	return nil
}

// UsageByID finds one ledger row.
func UsageByID(ctx context.Context, db *gorm.DB, id string) (*Usage, error) {
	var u Usage
	err := db.WithContext(ctx).Where("inference_id = ?", id).Take(&u).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find usage %s: %w", id, err)
	}
	return &u, nil
}

// UsageByResponseID returns the row of the Responses request whose
// response id is id.
func UsageByResponseID(ctx context.Context, db *gorm.DB, id string) (*Usage, error) {
	var u Usage
	// The second condition is the partial index's own: SQLite (and
	// PostgreSQL with a generic plan) uses a partial index only when the
	// query states its condition.
	err := db.WithContext(ctx).Where("response_id = ? AND response_id <> ''", id).Take(&u).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find usage of response %s: %w", id, err)
	}
	return &u, nil
}

// CloseUnfinishedUsage closes rows left pending by a crash as errors with
// reason gateway_restart, so that no request is left without a final row.
// It closes the rows of every replica whose last heartbeat is older than
// staleBefore; rows of live replicas are left alone. At start-up, a replica
// passes its own id as restarted: its old rows are orphans, since nothing of
// its previous life is running. Afterwards it passes "", so that its own
// running requests count as live.
func CloseUnfinishedUsage(ctx context.Context, db *gorm.DB, restarted string, staleBefore time.Time) (int64, error) {
	var closed int64
	for {
		n, err := closeUnfinished(ctx, db, restarted, staleBefore)
		closed += n
		if err != nil {
			return closed, err
		}
		if n < closeChunk {
			break
		}
	}
	if err := db.WithContext(ctx).Where("seen_at < ?", staleBefore.UTC()).Delete(&Replica{}).Error; err != nil {
		return closed, fmt.Errorf("forget stale replicas: %w", err)
	}
	return closed, nil
}

// closeChunk bounds the rows one transaction of CloseUnfinishedUsage closes.
const closeChunk = 500

// closeUnfinished closes up to closeChunk orphaned rows and adds them to the
// rollup, in one transaction: a row is counted exactly when it turns final.
func closeUnfinished(ctx context.Context, db *gorm.DB, restarted string, staleBefore time.Time) (int64, error) {
	var closed int64
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		now := time.Now().UTC()
		live := tx.Model(&Replica{}).Select("id").Where("seen_at >= ? AND id <> ?", staleBefore.UTC(), restarted)
		q := tx.Where("outcome = ?", OutcomePending).Where("replica NOT IN (?)", live).Limit(closeChunk)
		if tx.Dialector.Name() == "postgres" {
			// Two replicas closing the same orphans: the second waits,
			// then finds them no longer pending.
			q = q.Clauses(clause.Locking{Strength: "UPDATE"})
		}
		var rows []Usage
		if err := q.Find(&rows).Error; err != nil {
			return fmt.Errorf("find unfinished usage rows: %w", err)
		}
		if len(rows) == 0 {
			return nil
		}
		ids := make([]string, len(rows))
		r := NewRollup()
		for i := range rows {
			ids[i] = rows[i].InferenceID
			rows[i].Outcome, rows[i].Reason, rows[i].FinishedAt, rows[i].Status = OutcomeError, "gateway_restart", &now, 0
			r.Add(&rows[i])
		}
		res := tx.Model(&Usage{}).Where("inference_id IN ? AND outcome = ?", ids, OutcomePending).
			Updates(map[string]any{"outcome": OutcomeError, "reason": "gateway_restart", "finished_at": now, "status": 0})
		if res.Error != nil {
			return fmt.Errorf("close unfinished usage rows: %w", res.Error)
		}
		if res.RowsAffected != int64(len(rows)) {
			// Only possible if something finished them meanwhile, which
			// the transaction (and FOR UPDATE) rules out; refuse rather
			// than count rows twice.
			return fmt.Errorf("close unfinished usage rows: %d of %d changed", res.RowsAffected, len(rows))
		}
		closed = res.RowsAffected
		return r.Apply(tx)
	})
	return closed, err
}

// EachUsage calls fn for every row created at or after since, oldest first,
// streaming rows from the database so a large export stays small in memory.
func EachUsage(ctx context.Context, db *gorm.DB, since time.Time, fn func(*Usage) error) error {
	return EachUsageOf(ctx, db, since, 0, fn)
}

// EachUsageOf is EachUsage for one person's rows (userID 0: everyone's).
func EachUsageOf(ctx context.Context, db *gorm.DB, since time.Time, userID uint, fn func(*Usage) error) error {
	q := db.WithContext(ctx).Model(&Usage{}).Where("created_at >= ?", since.UTC())
	if userID != 0 {
		q = q.Where("user_id = ?", userID)
	}
	rows, err := q.Order("created_at, inference_id").Rows()
	if err != nil {
		return fmt.Errorf("read usage: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var u Usage
		if err := db.ScanRows(rows, &u); err != nil {
			return fmt.Errorf("scan usage row: %w", err)
		}
		if err := fn(&u); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read usage: %w", err)
	}
	return nil
}

// ListUsage returns the newest rows, for admin pages and tests.
func ListUsage(ctx context.Context, db *gorm.DB, limit int) ([]Usage, error) {
	var rows []Usage
	if err := db.WithContext(ctx).Order("created_at DESC").Limit(limit).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list usage: %w", err)
	}
	return rows, nil
}

// finalFields are the fields a request's end sets on its pending row.
var finalFields = []string{"FinishedAt", "Outcome", "Status", "Reason", "PromptTokens", "CompletionTokens", "CachedTokens", "Cost",
	"UsageSource", "QueueMs", "TTFTMs", "DurationMs", "Backend", "RetriedFrom", "ResponseID"}

// RecordUnwritten gives each row a crashed process began but never wrote
// (its journal's leftovers) its one final row: an error with reason
// gateway_restart, counted in the rollup. A row the database already has —
// written before the crash, then closed or finished — is left alone. A row
// that is already final (the journal kept its final state while the
// database was away) keeps that state: inserted, or, when its pending row
// is in the database, put in its place. It returns how many rows it added
// or finished.
func RecordUnwritten(ctx context.Context, db *gorm.DB, rows []Usage) (int64, error) {
	var added int64
	for len(rows) > 0 {
		n := min(len(rows), closeChunk)
		chunk := rows[:n]
		rows = rows[n:]
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			now := time.Now().UTC()
			r := NewRollup()
			for i := range chunk {
				u := chunk[i]
				u.Sanitize()
				final := u.Outcome != OutcomePending && u.FinishedAt != nil
				if !final {
					u.Outcome, u.Reason, u.Status, u.FinishedAt = OutcomeError, "gateway_restart", 0, &now
				}
				res := tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&u)
				if res.Error != nil {
					return fmt.Errorf("record unwritten usage row %s: %w", u.InferenceID, res.Error)
				}
				if res.RowsAffected == 0 && final {
					res = tx.Model(&Usage{}).Where("inference_id = ? AND outcome = ?", u.InferenceID, OutcomePending).
						Select(finalFields).Updates(&u)
					if res.Error != nil {
						return fmt.Errorf("finish unwritten usage row %s: %w", u.InferenceID, res.Error)
					}
				}
				if res.RowsAffected == 1 {
					r.Add(&u)
					added++
				}
			}
			return r.Apply(tx)
		})
		if err != nil {
			return added, err
		}
	}
	return added, nil
}
