package ledger

import (
	"context"
	"fmt"
	"testing"
	"time"

	"moonji/models"
)

// BenchmarkRecord measures the CPU one final row costs the ledger (the row
// of a refused request), written in the batches the writer forms.
//
//	go test ./internal/ledger -run '^$' -bench Record -benchmem
func BenchmarkRecord(b *testing.B) {
	db, err := models.Open("sqlite://" + b.TempDir() + "/l.db")
	if err != nil {
		b.Fatal(err)
	}
	l := New(db, nil)
	defer func() { l.Close(); models.Close(db) }()
	now := time.Now().UTC()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r := models.Usage{InferenceID: fmt.Sprintf("inf_%026d", i), CreatedAt: now, Model: "m", Source: "api",
			Outcome: models.OutcomeRejected, Status: 503, Reason: "queue_full", User: "a@example.com", Replica: "r"}
		l.Record(r)
		i++
		if i%64 == 0 {
			_ = l.Flush(context.Background())
		}
	}
	_ = l.Flush(context.Background())
}
