package models

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"
)

// The people list: filtered by email with LIKE's wildcards taken literally,
// bounded, active keys counted in one query for everyone (no query per
// person), hostile filters answered without an error.
func TestListPeople(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		now := time.Now()
		ids := map[string]uint{}
		for _, email := range []string{"alice@example.com", "bob@example.com", "100%real@example.com",
			"a_b@example.com", "axb@example.com", `back\slash@example.com`} {
			u, err := EnsureUser(ctx, db, email)
			if err != nil {
				t.Fatal(err)
			}
			ids[email] = u.ID
		}
		past, future := now.Add(-time.Hour), now.Add(time.Hour)
		alice := ids["alice@example.com"]
		for i, k := range []APIKey{
			{UserID: alice},                     // active
			{UserID: alice, ExpiresAt: &future}, // active until later
			{UserID: alice, RevokedAt: &past},   // revoked
			{UserID: alice, ExpiresAt: &past},   // expired
			{UserID: ids["bob@example.com"], RevokedAt: &past},
		} {
			k.Name, k.Prefix, k.Hash = "k", "mj-x", string(rune('a'+i))+"hash"
			if err := CreateAPIKey(ctx, db, &k); err != nil {
				t.Fatal(err)
			}
		}

		var queries atomic.Int64
		count := func(*gorm.DB) { queries.Add(1) }
		db.Callback().Query().Before("gorm:query").Register("count_people", count)
		db.Callback().Row().Before("gorm:row").Register("count_people_rows", count)
		people, more, err := ListPeople(ctx, db, "", 100, now)
		db.Callback().Query().Remove("count_people")
		db.Callback().Row().Remove("count_people_rows")
		if err != nil || more || len(people) != 6 {
			t.Fatalf("ListPeople = %d people, more %v, %v", len(people), more, err)
		}
		if n := queries.Load(); n != 2 {
			t.Errorf("%d queries for 6 people, want 2 (users, then one count for all)", n)
		}
		emails := make([]string, len(people))
		for i, p := range people {
			emails[i] = p.Email
			want := int64(0)
			if p.ID == alice {
				want = 2
			}
			if p.ActiveKeys != want {
				t.Errorf("%s: %d active keys, want %d", p.Email, p.ActiveKeys, want)
			}
		}
		if !slices.IsSorted(emails) {
			t.Errorf("not by email: %v", emails)
		}

		for filter, want := range map[string][]string{
			"ALICE":    {"alice@example.com"},
			"%":        {"100%real@example.com"},
			"_":        {"a_b@example.com"},
			"a_b":      {"a_b@example.com"},
			`\`:        {`back\slash@example.com`},
			`k\s`:      {`back\slash@example.com`},
			"  bob@  ": {"bob@example.com"},
			"nobody":   nil,
			// Hostile: quotes, SQL, NUL and invalid UTF-8 (PostgreSQL refuses
			// both in any string), a long run of wildcards.
			"' OR 1=1 --":        nil,
			"\x00":               nil,
			"b\x00ob":            {"bob@example.com"},
			"\xff\xfe":           nil,
			"%%%%%%%%%%%%%%%%%%": nil,
		} {
			got, _, err := ListPeople(ctx, db, filter, 100, now)
			if err != nil {
				t.Errorf("filter %q: %v", filter, err)
				continue
			}
			var emails []string
			for _, p := range got {
				emails = append(emails, p.Email)
			}
			if filter == "\x00" {
				want = emails // NUL alone is dropped: the filter matches everyone
				if len(emails) != 6 {
					t.Errorf("filter NUL: %v, want everyone", emails)
				}
			}
			if !slices.Equal(emails, want) {
				t.Errorf("filter %q: %v, want %v", filter, emails, want)
			}
		}

		// Bounded: the first two by email, and a word that there are more.
		people, more, err = ListPeople(ctx, db, "", 2, now)
		if err != nil || !more || len(people) != 2 || people[0].Email != "100%real@example.com" {
			t.Errorf("limit 2: %d people (%v), more %v, %v", len(people), people, more, err)
		}
		p, err := PersonByID(ctx, db, alice, now)
		if err != nil || p.Email != "alice@example.com" || p.ActiveKeys != 2 {
			t.Errorf("PersonByID = %+v, %v", p, err)
		}
		if _, err := PersonByID(ctx, db, 999999, now); !errors.Is(err, ErrNotFound) {
			t.Errorf("PersonByID of nobody: %v, want ErrNotFound", err)
		}

		// Everyone's keys by owner: the same filter, newest first, bounded.
		keys, more, err := ListAllAPIKeys(ctx, db, "ALI", 100)
		if err != nil || more || len(keys) != 4 || keys[0].User.Email != "alice@example.com" || keys[0].ID < keys[3].ID {
			t.Errorf("keys of ALI: %d, more %v, %v", len(keys), more, err)
		}
		if keys, _, err := ListAllAPIKeys(ctx, db, "%", 100); err != nil || len(keys) != 0 {
			t.Errorf("keys of %%: %d, %v; want none (nobody with keys has %% in the email)", len(keys), err)
		}
		if keys, more, err := ListAllAPIKeys(ctx, db, "", 3); err != nil || !more || len(keys) != 3 {
			t.Errorf("all keys, limit 3: %d, more %v, %v", len(keys), more, err)
		}
		for _, hostile := range []string{"' OR 1=1 --", "\x00", "\xff", `\%_`} {
			if _, _, err := ListAllAPIKeys(ctx, db, hostile, 100); err != nil {
				t.Errorf("keys filter %q: %v", hostile, err)
			}
		}
	})
}

// Disabling a person deletes all their sessions (and no one else's) in the
// same transaction, keeps the first time when repeated, and enabling clears
// the flag without bringing sessions back.
func TestDisableUser(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		u, _ := EnsureUser(ctx, db, "u@example.com")
		v, _ := EnsureUser(ctx, db, "v@example.com")
		now := time.Now()
		for i, uid := range []uint{u.ID, u.ID, v.ID} {
			s := &Session{ID: string(rune('a'+i)) + "-session", UserID: uid, CreatedAt: now, LastSeenAt: now, ExpiresAt: now.Add(time.Hour)}
			if err := CreateSession(ctx, db, s); err != nil {
				t.Fatal(err)
			}
		}
		first := now.Add(-time.Minute)
		got, ended, err := DisableUser(ctx, db, u.ID, first)
		if err != nil || ended != 2 || !got.Disabled() || got.Email != "u@example.com" {
			t.Fatalf("DisableUser = %+v, %d, %v; want 2 sessions ended", got, ended, err)
		}
		var left []Session
		db.Find(&left)
		if len(left) != 1 || left[0].UserID != v.ID {
			t.Fatalf("sessions left %+v: want only v's", left)
		}
		again, ended, err := DisableUser(ctx, db, u.ID, now)
		if err != nil || ended != 0 || again.DisabledAt == nil || again.DisabledAt.Sub(first).Abs() > time.Millisecond {
			t.Errorf("disabled twice: %v, %d, %v; want the first time kept", again.DisabledAt, ended, err)
		}
		stored, _ := UserByID(ctx, db, u.ID)
		if !stored.Disabled() {
			t.Error("the flag is not stored")
		}
		if other, _ := UserByID(ctx, db, v.ID); other.Disabled() {
			t.Error("another person was disabled too")
		}

		enabled, err := EnableUser(ctx, db, u.ID)
		if err != nil || enabled.Disabled() {
			t.Fatalf("EnableUser = %+v, %v", enabled, err)
		}
		var n int64
		db.Model(&Session{}).Where("user_id = ?", u.ID).Count(&n)
		if n != 0 {
			t.Errorf("%d sessions after enabling, want none restored", n)
		}
		if _, _, err := DisableUser(ctx, db, 987654, now); !errors.Is(err, ErrNotFound) {
			t.Errorf("disable nobody: %v, want ErrNotFound", err)
		}
		if _, err := EnableUser(ctx, db, 987654); !errors.Is(err, ErrNotFound) {
			t.Errorf("enable nobody: %v, want ErrNotFound", err)
		}

		if err := RecordLogin(ctx, db, v.ID, now); err != nil {
			t.Fatal(err)
		}
		if got, _ := UserByID(ctx, db, v.ID); got.LastLoginAt == nil || got.LastLoginAt.Sub(now).Abs() > time.Millisecond {
			t.Errorf("last login %v, want %v", got.LastLoginAt, now)
		}
	})
}
