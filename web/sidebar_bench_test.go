//go:build bench

package web_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/internal/testdb"
	"moonji/models"
)

// BenchmarkSidebar measures the sidebar of one person with 10,000
// conversations (issue 45: the sidebar stays fast), 20 of them pinned and
// 70 % in 30 folders, one of which holds only 5: the sidebar's queries as a
// page runs them (the list, pinned first, and the folders), the list's
// next page after a pinned cursor, one folder's list, and over HTTP the
// whole chat page (GET /c/{id}, its sidebar included) and the sidebar
// alone (GET /sidebar). On SQLite and, when MOONJI_TEST_POSTGRES_DSN is
// set, PostgreSQL; each timing is reported as p50 and p95 too. The last
// sub-benchmarks run the list again without the list's indexes, to show
// what they buy.
//
//	MOONJI_TEST_POSTGRES_DSN=… go test -tags bench ./web -run '^$' -bench Sidebar -benchtime 300x -timeout 30m
//
// MOONJI_BENCH_CONVERSATIONS changes the 10,000.
func BenchmarkSidebar(b *testing.B) {
	n := envInt("MOONJI_BENCH_CONVERSATIONS", 10000)
	dbs := []struct{ name, url string }{{"sqlite", "sqlite://" + b.TempDir() + "/sidebar.db"}}
	if dsn := os.Getenv("MOONJI_TEST_POSTGRES_DSN"); dsn != "" {
		dbs = append(dbs, struct{ name, url string }{"postgres", testdb.PostgresSchema(b, dsn)})
	}
	for _, db := range dbs {
		b.Run(db.name, func(b *testing.B) {
			mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Logger: quietLog()})
			cfg := &config.Config{DatabaseURL: db.url, RateLimit: config.RateLimit{RequestsPerMinute: 1_000_000},
				Backends: []config.Backend{{Name: "mock", URL: "http://127.0.0.1:9/v1", MaxConcurrency: 4}},
				Models:   []config.Model{{Name: "m1", Backend: "mock"}}}
			e := startWithConfig(b, cfg, mock, "")
			p := e.chatter("many@example.com")
			u, err := models.UserByEmail(context.Background(), e.DB, "many@example.com")
			if err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			open := seedSidebar(b, e, u.ID, n)
			if db.name == "postgres" {
				e.DB.Exec("ANALYZE conversations") // what autovacuum does soon after a bulk load
			}
			b.Logf("%s: seeded %d conversations of one person in %v", db.name, n, time.Since(t0).Round(time.Millisecond))
			ctx := context.Background()
			svc := e.srv.Chat
			first, err := svc.List(ctx, u.ID, "", "")
			if err != nil || first.NextCursor == "" || !first.Conversations[0].Pinned {
				b.Fatalf("first page: %v, %+v", err, first.NextCursor)
			}
			timed(b, "sidebar queries (list + folders)", func() error {
				if _, err := svc.List(ctx, u.ID, "", ""); err != nil {
					return err
				}
				_, err := svc.Folders(ctx, u.ID)
				return err
			})
			timed(b, "list, second page", func() error {
				_, err := svc.List(ctx, u.ID, "", first.NextCursor)
				return err
			})
			timed(b, "folders", func() error {
				f, err := svc.Folders(ctx, u.ID)
				if err == nil && len(f) != 30 {
					err = fmt.Errorf("%d folders", len(f))
				}
				return err
			})
			timed(b, "list of a folder of 5", func() error {
				_, err := svc.ListIn(ctx, u.ID, "Small folder", "", "")
				return err
			})
			timed(b, "list of a folder of ~230", func() error {
				_, err := svc.ListIn(ctx, u.ID, "Folder 07", "", "")
				return err
			})
			timed(b, "page GET /c/{id}", func() error {
				pg := p.page("/c/" + open)
				if pg.status != http.StatusOK || !strings.Contains(pg.body, `aria-label="Pinned"`) {
					return fmt.Errorf("page: %d", pg.status)
				}
				return nil
			})
			timed(b, "GET /sidebar", func() error {
				if pg := p.page("/sidebar?current=" + open); pg.status != http.StatusOK {
					return fmt.Errorf("sidebar: %d", pg.status)
				}
				return nil
			})
			for _, idx := range []string{"idx_conversations_user_pinned_updated", "idx_conversations_user_folder_pinned_updated"} {
				if err := e.DB.Exec("DROP INDEX " + idx).Error; err != nil {
					b.Fatal(err)
				}
			}
			timed(b, "without the indexes: sidebar queries", func() error {
				if _, err := svc.List(ctx, u.ID, "", ""); err != nil {
					return err
				}
				_, err := svc.Folders(ctx, u.ID)
				return err
			})
			timed(b, "without the indexes: list of a folder of 5", func() error {
				_, err := svc.ListIn(ctx, u.ID, "Small folder", "", "")
				return err
			})
		})
	}
}

// seedSidebar stores n conversations of person userID, last used over the
// past year: every 500th pinned, 70 % in "Folder 00" … "Folder 28", 5 in
// "Small folder"; it returns one to open, with a question and an answer.
func seedSidebar(b *testing.B, e *testEnv, userID uint, n int) string {
	end := time.Now().UTC()
	var batch []models.Conversation
	for i := range n {
		at := end.Add(-time.Duration(n-i) * 50 * time.Minute)
		c := models.Conversation{ID: models.NewConversationID(), UserID: userID, Model: "m1", CreatedAt: at, UpdatedAt: at,
			Title: fmt.Sprintf("Conversation %d about something", i), Pinned: i%500 == 7}
		switch {
		case i%1000 == 3 && i < 5000:
			c.Folder = "Small folder"
		case i%10 < 7:
			c.Folder = fmt.Sprintf("Folder %02d", i%29)
		}
		batch = append(batch, c)
	}
	if err := e.DB.CreateInBatches(batch, 500).Error; err != nil {
		b.Fatal(err)
	}
	open := batch[n-1].ID
	for i, text := range []string{"What is in my sidebar?", "Ten thousand conversations, pinned ones first."} {
		role := models.RoleUser
		if i == 1 {
			role = models.RoleAssistant
		}
		if err := e.DB.Create(&models.Message{ID: models.NewMessageID(), ConversationID: open, Role: role, Content: text,
			Status: models.MessageDone, Model: "m1"}).Error; err != nil {
			b.Fatal(err)
		}
	}
	return open
}

// timed runs fn as a sub-benchmark, and reports its p50 and p95 besides
// the mean (ns/op).
func timed(b *testing.B, name string, fn func() error) {
	b.Run(name, func(b *testing.B) {
		for range 5 { // warm: connections, plans, caches
			if err := fn(); err != nil {
				b.Fatal(err)
			}
		}
		var took []time.Duration
		for b.Loop() {
			t0 := time.Now()
			if err := fn(); err != nil {
				b.Fatal(err)
			}
			took = append(took, time.Since(t0))
		}
		slices.Sort(took)
		b.ReportMetric(float64(took[len(took)/2])/1e6, "p50-ms")
		b.ReportMetric(float64(took[len(took)*95/100])/1e6, "p95-ms")
	})
}
