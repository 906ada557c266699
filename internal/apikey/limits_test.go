package apikey

import (
	"context"
	"errors"
	"testing"

	"moonji/models"
)

// CreateLimited stores the budget and model list in the key's own row, and
// refuses invalid ones before storing anything.
func TestCreateLimited(t *testing.T) {
	ctx := context.Background()
	db, err := models.Open("sqlite://" + t.TempDir() + "/keys.db")
	if err != nil {
		t.Fatal(err)
	}
	defer models.Close(db)
	u, _ := models.EnsureUser(ctx, db, "a@example.com")
	budget := int64(3)
	secret, key, err := CreateLimited(ctx, db, u.ID, "k", 0, 0, models.Limits{Budget: &budget, BudgetPeriod: models.BudgetTotal, Models: "x, y,x"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := models.APIKeyByHash(ctx, db, Hash(secret))
	if err != nil || got.ID != key.ID || got.Budget == nil || *got.Budget != 3 || got.BudgetPeriod != models.BudgetTotal || got.Models != "x,y" {
		t.Fatalf("stored %+v, %v", got, err)
	}
	for _, bad := range []models.Limits{
		{Budget: &budget},
		{BudgetPeriod: models.BudgetDay},
		{Budget: &budget, BudgetPeriod: "year"},
		{Models: "a\x00"},
	} {
		if _, _, err := CreateLimited(ctx, db, u.ID, "bad", 0, 0, bad); !errors.Is(err, models.ErrInvalid) {
			t.Errorf("CreateLimited(%+v) = %v", bad, err)
		}
	}
	var n int64
	db.Model(&models.APIKey{}).Count(&n)
	if n != 1 {
		t.Errorf("%d keys stored", n)
	}
}
