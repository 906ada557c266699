package ledger

import (
	"slices"
	"testing"
	"time"

	"gorm.io/gorm"

	"moonji/internal/testdb"
	"moonji/models"
)

// The JSON writer names every column gorm knows for a Usage, once: a field
// added to models.Usage must be added to rowsjson.go too.
func TestJSONColumnsMatchSchema(t *testing.T) {
	l := open(t)
	stmt := &gorm.Statement{DB: l.db}
	if err := stmt.Parse(&models.Usage{}); err != nil {
		t.Fatal(err)
	}
	var schema []string
	for _, f := range stmt.Schema.Fields {
		if f.DBName != "" {
			schema = append(schema, f.DBName)
		}
	}
	got := slices.Clone(usageColumns)
	slices.Sort(got)
	slices.Sort(schema)
	if !slices.Equal(got, schema) {
		t.Errorf("sqliteColumns = %v\ngorm's columns = %v", got, schema)
	}
}

// storedRow is every column of a row as the database holds it: its type
// and its SQL literal (SQLite) or text (PostgreSQL), so that a time written
// as other text or to another precision, or a number written as text,
// shows.
func storedRow(t *testing.T, db *gorm.DB, id string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, c := range usageColumns {
		if c == "inference_id" {
			continue
		}
		q := `SELECT typeof("` + c + `") || ' ' || quote("` + c + `") FROM usages WHERE inference_id = ?`
		if db.Dialector.Name() == "postgres" {
			q = `SELECT pg_typeof("` + c + `")::text || ' ' || coalesce("` + c + `"::text, 'NULL') FROM usages WHERE inference_id = ?`
		}
		var v string
		if err := db.Raw(q, id).Scan(&v).Error; err != nil {
			t.Fatal(err)
		}
		if v == "" {
			t.Fatalf("no row %s", id)
		}
		out[c] = v
	}
	return out
}

func fullRow(id string) models.Usage {
	// Nanoseconds past the microsecond: PostgreSQL would round them up
	// where pgx truncates them.
	created := time.Date(2026, 12, 2, 3, 4, 5, 120_000_700, time.UTC)
	finished := created.Add(1500*time.Millisecond + 600)
	user, key := uint(7), uint(12)
	ttft := int64(42)
	u := models.Usage{InferenceID: id, CreatedAt: created, FinishedAt: &finished, UserID: &user,
		User: `"ada" <ada@example.com> \ 문지기 🚪`, KeyID: &key, Source: "api", API: "chat",
		Model: "llama\x00-3\t\"8b\"\\", Backend: "b1,b2", RetriedFrom: "b0", ResponseID: "resp_1",
		Outcome: models.OutcomeSuccess, Status: 200, Reason: "bad \xff\xfe utf-8 \u2028", PromptTokens: 11,
		CompletionTokens: 1 << 40, UsageSource: models.UsageFromEngine, QueueMs: 3, TTFTMs: &ttft,
		DurationMs: 1500, Replica: "replica-a"}
	u.Sanitize()
	return u
}

// A row written as JSON is stored exactly as gorm's Create stores it:
// same types, same text for times, NULL for nil pointers.
func TestJSONRowsStoreWhatGormStores(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		l := openAt(t, dbURL)
		db := l.db
		for name, mod := range map[string]func(*models.Usage){
			"full":  func(*models.Usage) {},
			"nulls": func(u *models.Usage) { u.FinishedAt, u.UserID, u.KeyID, u.TTFTMs = nil, nil, nil, nil },
			"local time": func(u *models.Usage) {
				u.CreatedAt = u.CreatedAt.In(time.FixedZone("KST", 9*3600))
			},
		} {
			t.Run(name, func(t *testing.T) {
				want, got := fullRow("inf_gorm_"+name), fullRow("inf_json_"+name)
				mod(&want)
				mod(&got)
				if err := db.Create(&want).Error; err != nil {
					t.Fatal(err)
				}
				err := db.Transaction(func(tx *gorm.DB) error {
					_, _, err := l.rows.write(tx, l.rows.insert, []models.Usage{got}, nil)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				w, g := storedRow(t, db, want.InferenceID), storedRow(t, db, got.InferenceID)
				for c := range w {
					if w[c] != g[c] {
						t.Errorf("%s: gorm stored %s, the JSON writer %s", c, w[c], g[c])
					}
				}
			})
		}
	})
}

// The upsert finishes a pending row to exactly what a final insert stores,
// and leaves a row that is already final alone (upsertSQL).
func TestJSONUpsertFinishes(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		l := openAt(t, dbURL)
		db := l.db
		want := fullRow("inf_final")
		if err := db.Create(&want).Error; err != nil {
			t.Fatal(err)
		}
		pending := fullRow("inf_pending")
		pending.Outcome, pending.FinishedAt, pending.Status, pending.CompletionTokens = models.OutcomePending, nil, 0, 0
		closed := fullRow("inf_closed")
		closed.Outcome, closed.Reason = models.OutcomeError, "gateway_restart"
		if err := db.Create([]models.Usage{pending, closed}).Error; err != nil {
			t.Fatal(err)
		}
		var n int64
		err := db.Transaction(func(tx *gorm.DB) (err error) {
			n, _, err = l.rows.write(tx, l.rows.upsert, []models.Usage{fullRow("inf_pending"), fullRow("inf_closed")}, nil)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("the upsert changed %d rows, want 1 (the pending one)", n)
		}
		w, g := storedRow(t, db, "inf_final"), storedRow(t, db, "inf_pending")
		for c := range w {
			if w[c] != g[c] {
				t.Errorf("%s: a final insert stored %s, the upsert %s", c, w[c], g[c])
			}
		}
		if u, _ := models.UsageByID(t.Context(), db, "inf_closed"); u == nil || u.Outcome != models.OutcomeError || u.Reason != "gateway_restart" {
			t.Errorf("a row closed by another replica was overwritten: %+v", u)
		}
	})
}

// A zero CreatedAt is written as the time of the write, as gorm does.
func TestJSONZeroCreatedAt(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		l := openAt(t, dbURL)
		u := fullRow("inf_zero")
		u.CreatedAt = time.Time{}
		before := time.Now().Add(-time.Second)
		if _, _, err := l.rows.write(l.db, l.rows.insert, []models.Usage{u}, nil); err != nil {
			t.Fatal(err)
		}
		got := get(t, l, "inf_zero")
		if got.CreatedAt.Before(before) || got.CreatedAt.After(time.Now().Add(time.Second)) {
			t.Errorf("created_at = %v, want about now", got.CreatedAt)
		}
	})
}
