package journal

import (
	"strconv"
	"testing"
	"time"

	"moonji/models"
)

func finalRow(id string) *models.Usage {
	r := row(id)
	now := time.Now().UTC().Truncate(time.Millisecond)
	r.Outcome, r.Status, r.FinishedAt, r.CompletionTokens = "success", 200, &now, 3
	return r
}

// A final row written while the database was away keeps its segments until
// it is durable, even once later segments are written and earlier ones
// emptied; Finals reads back only those still open; and after a crash the
// next start returns its final state, not its Begin.
func TestFinalRowsComeBack(t *testing.T) {
	dir := t.TempDir()
	j, _, err := Open(dir, "r1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Begin(row("a")); err != nil {
		t.Fatal(err)
	}
	// b's Begin is durable (its pending row written) before its final row.
	if err := j.Begin(row("b")); err != nil {
		t.Fatal(err)
	}
	j.Durable("b")
	fill(t, j, "x") // a's and b's records' segment is no longer current
	for _, id := range []string{"a", "b", "c"} {
		if err := j.Final(finalRow(id)); err != nil {
			t.Fatal(err)
		}
	}
	fill(t, j, "y")
	var xs []string
	for i := range 3000 {
		xs = append(xs, "x-"+strconv.Itoa(i), "y-"+strconv.Itoa(i))
	}
	j.Durable(xs...) // every segment's other rows: only the finals hold them
	var got []models.Usage
	if err := j.Finals(func(rows []models.Usage) error { got = append(got, rows...); return nil }); err != nil {
		t.Fatal(err)
	}
	if ids(got) != "a,b,c" || got[0].Outcome != "success" || got[0].FinishedAt == nil {
		t.Fatalf("finals = %s, want a, b, c final", ids(got))
	}
	j.Durable("c")
	crash(t, j)

	j2, left, err := Open(dir, "r1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j2.Close()
	if ids(left) != "a,b" || left[0].Outcome != "success" || left[1].Outcome != "success" || left[1].CompletionTokens != 3 {
		t.Fatalf("leftovers = %s (%d), want a and b as they ended", ids(left[:min(len(left), 5)]), len(left))
	}
}
