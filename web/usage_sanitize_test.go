package web_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"moonji/models"
)

// TestOddModelNamesKeepTheirRow: a model name PostgreSQL cannot store as it
// is (longer than its column, with a NUL, invalid UTF-8) still leaves the
// request its one row, with the name made storable; on SQLite and on
// PostgreSQL alike.
func TestOddModelNamesKeepTheirRow(t *testing.T) {
	names := []struct {
		name string
		json string // the model's JSON string, quotes included
		want string // the model in its row
	}{
		{"300 characters", strconv.Quote(strings.Repeat("x", 300)), strings.Repeat("x", 200)},
		{"250 two-byte characters", strconv.Quote(strings.Repeat("é", 250)), strings.Repeat("é", 200)},
		{"escaped NUL", `"a\u0000b"`, "ab"},
		{"raw control bytes", "\"a\x01b\x1fc\"", "abc"},
		{"invalid UTF-8", "\"\xff\xfe\"", "\uFFFD"},
		{"spreadsheet formula", strconv.Quote("=cmd|' /C calc'!A0"), "=cmd|' /C calc'!A0"},
	}
	eachDatabase(t, func(t *testing.T, db string) {
		e := startEnv(t, db)
		for _, n := range names {
			t.Run(n.name, func(t *testing.T) {
				resp := e.post(`{"model":` + n.json + `,"messages":[{"role":"user","content":"x"}]}`)
				body := readAll(t, resp.Body)
				if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusBadRequest {
					t.Fatalf("status %d: %s", resp.StatusCode, body)
				}
				id := resp.Header.Get("X-Inference-Id")
				row := e.final(id)
				var count int64
				if err := e.DB.Model(&models.Usage{}).Where("inference_id = ?", id).Count(&count).Error; err != nil || count != 1 {
					t.Fatalf("%d rows for %s (%v)", count, id, err)
				}
				if row.Outcome != models.OutcomeRejected || row.Status != resp.StatusCode || row.KeyID == nil {
					t.Errorf("row = %+v", row)
				}
				// A name the gateway's JSON parser refuses leaves a 400 row
				// without one.
				if resp.StatusCode == http.StatusNotFound && row.Model != n.want {
					t.Errorf("stored model %q, want %q", row.Model, n.want)
				}
				got, err := models.UsageByID(context.Background(), e.DB, id)
				if err != nil || got.InferenceID != id {
					t.Fatalf("UsageByID(%s) = %+v, %v", id, got, err)
				}
			})
		}
	})
}
