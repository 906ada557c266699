package models

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"gorm.io/gorm"
)

func teamNames(teams []Team) []string {
	out := make([]string, len(teams))
	for i, t := range teams {
		out[i] = t.Name
	}
	return out
}

func memberSources(t *testing.T, db *gorm.DB, userID uint) map[string]string {
	t.Helper()
	var rows []struct {
		Name   string
		Source string
	}
	err := db.Table("team_members").Select("teams.name, team_members.source").
		Joins("JOIN teams ON teams.id = team_members.team_id").Where("team_members.user_id = ?", userID).Scan(&rows).Error
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, r := range rows {
		out[r.Name] = r.Source
	}
	return out
}

// Teams: created with their limits, names validated and unique, members
// added (twice harmlessly) and removed, counted, listed both ways, budgets
// and model lists set and cleared, deleted with their memberships.
func TestTeams(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		five := int64(5_000_000_000)
		eng, err := CreateTeam(ctx, db, "  engineering ", Limits{Budget: &five, BudgetPeriod: BudgetMonth, Models: " b, a ,b,"})
		if err != nil {
			t.Fatal(err)
		}
		if eng.Name != "engineering" || *eng.Budget != five || eng.BudgetPeriod != BudgetMonth || eng.Models != "b,a" {
			t.Fatalf("created %+v", eng)
		}
		if _, err := CreateTeam(ctx, db, "engineering", Limits{}); !errors.Is(err, ErrTeamExists) {
			t.Errorf("second team of the same name: %v", err)
		}
		for _, bad := range []struct {
			name   string
			limits Limits
		}{
			{"", Limits{}},
			{"   ", Limits{}},
			{strings.Repeat("x", 101), Limits{}},
			{"tab\there", Limits{}},
			{"nul\x00", Limits{}},
			{"bad\xffutf8", Limits{}},
			{"ok", Limits{BudgetPeriod: BudgetDay}},                         // a period without an amount
			{"ok", Limits{Budget: &five}},                                   // an amount without a period
			{"ok", Limits{Budget: &five, BudgetPeriod: "week"}},             // an unknown period
			{"ok", Limits{Budget: new(int64(-1)), BudgetPeriod: BudgetDay}}, // negative
			{"ok", Limits{Models: "a,\x1b[31m"}},
		} {
			if _, err := CreateTeam(ctx, db, bad.name, bad.limits); !errors.Is(err, ErrInvalid) {
				t.Errorf("CreateTeam(%q, %+v) = %v, want ErrInvalid", bad.name, bad.limits, err)
			}
		}
		// 100 characters, not bytes.
		long, err := CreateTeam(ctx, db, strings.Repeat("é", 100), Limits{})
		if err != nil {
			t.Fatalf("a 100-character name: %v", err)
		}
		ops, err := CreateTeam(ctx, db, "ops", Limits{})
		if err != nil {
			t.Fatal(err)
		}

		ann, _ := EnsureUser(ctx, db, "ann@example.com")
		bob, _ := EnsureUser(ctx, db, "bob@example.com")
		for _, m := range [][2]uint{{eng.ID, ann.ID}, {eng.ID, bob.ID}, {eng.ID, ann.ID}, {ops.ID, ann.ID}} {
			if err := AddTeamMember(ctx, db, m[0], m[1]); err != nil {
				t.Fatal(err)
			}
		}
		if got, _ := TeamByName(ctx, db, " ops "); got == nil || got.ID != ops.ID {
			t.Errorf("TeamByName(ops) = %+v", got)
		}
		if _, err := TeamByName(ctx, db, "nobody"); !errors.Is(err, ErrNotFound) {
			t.Errorf("TeamByName of an unknown team: %v", err)
		}
		teams, err := TeamsOf(ctx, db, ann.ID)
		if err != nil || !slices.Equal(teamNames(teams), []string{"engineering", "ops"}) {
			t.Errorf("TeamsOf(ann) = %v, %v", teamNames(teams), err)
		}
		members, err := MembersOf(ctx, db, eng.ID)
		if err != nil || len(members) != 2 || members[0].Email != "ann@example.com" || members[1].Email != "bob@example.com" {
			t.Errorf("MembersOf(engineering) = %+v, %v", members, err)
		}
		list, err := ListTeams(ctx, db)
		if err != nil || len(list) != 3 {
			t.Fatalf("ListTeams = %+v, %v", list, err)
		}
		counts := map[string]int64{}
		for _, ti := range list {
			counts[ti.Name] = ti.Members
		}
		if counts["engineering"] != 2 || counts["ops"] != 1 || counts[long.Name] != 0 {
			t.Errorf("member counts %v", counts)
		}
		if list[0].Name != "engineering" || list[0].Budget == nil || list[0].Models != "b,a" {
			t.Errorf("first of the list: %+v", list[0])
		}

		if err := RemoveTeamMember(ctx, db, ops.ID, ann.ID); err != nil {
			t.Fatal(err)
		}
		if err := RemoveTeamMember(ctx, db, ops.ID, ann.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("removing twice: %v", err)
		}

		if err := SetTeamBudget(ctx, db, ops.ID, new(int64(7)), BudgetTotal); err != nil {
			t.Fatal(err)
		}
		if err := SetTeamModels(ctx, db, ops.ID, "m1"); err != nil {
			t.Fatal(err)
		}
		got, _ := TeamByName(ctx, db, "ops")
		if got.Budget == nil || *got.Budget != 7 || got.BudgetPeriod != BudgetTotal || got.Models != "m1" {
			t.Errorf("after the setters: %+v", got)
		}
		if err := SetTeamBudget(ctx, db, ops.ID, nil, ""); err != nil {
			t.Fatal(err)
		}
		if err := SetTeamModels(ctx, db, ops.ID, ""); err != nil {
			t.Fatal(err)
		}
		got, _ = TeamByName(ctx, db, "ops")
		if got.Budget != nil || got.BudgetPeriod != "" || got.Models != "" {
			t.Errorf("after clearing: %+v", got)
		}
		if err := SetTeamBudget(ctx, db, 9999, nil, ""); !errors.Is(err, ErrNotFound) {
			t.Errorf("budget of an unknown team: %v", err)
		}
		if err := SetTeamModels(ctx, db, ops.ID, strings.Repeat("m,", 50)+"\x07"); !errors.Is(err, ErrInvalid) {
			t.Errorf("a bell in a model list: %v", err)
		}

		if err := DeleteTeam(ctx, db, eng.ID); err != nil {
			t.Fatal(err)
		}
		if err := DeleteTeam(ctx, db, eng.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("deleting twice: %v", err)
		}
		var left int64
		db.Model(&TeamMember{}).Where("team_id = ?", eng.ID).Count(&left)
		if left != 0 {
			t.Errorf("%d memberships of a deleted team", left)
		}
		if teams, _ := TeamsOf(ctx, db, bob.ID); len(teams) != 0 {
			t.Errorf("bob still in %v", teamNames(teams))
		}
	})
}

// SyncOIDCTeams replaces the provider's memberships and only them: teams
// are created, dropped names leave, an admin's membership stays (and is
// not turned into the provider's), bad names and names beyond 100 are
// ignored without an error.
func TestSyncOIDCTeams(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		ann, _ := EnsureUser(ctx, db, "ann@example.com")
		bob, _ := EnsureUser(ctx, db, "bob@example.com")
		admins, err := CreateTeam(ctx, db, "admins-pick", Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if err := AddTeamMember(ctx, db, admins.ID, ann.ID); err != nil {
			t.Fatal(err)
		}

		if err := SyncOIDCTeams(ctx, db, ann.ID, []string{"eng", " ops ", "eng", "admins-pick", "", "bad\nname", "rtl\u202eeng", strings.Repeat("y", 101)}); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"eng": SourceOIDC, "ops": SourceOIDC, "admins-pick": SourceAdmin}
		if got := memberSources(t, db, ann.ID); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("after the first sync: %v, want %v", got, want)
		}
		// Another person of the same team: the team is found, not made again.
		if err := SyncOIDCTeams(ctx, db, bob.ID, []string{"eng"}); err != nil {
			t.Fatal(err)
		}
		var n int64
		db.Model(&Team{}).Where("name = ?", "eng").Count(&n)
		if n != 1 {
			t.Errorf("%d teams named eng", n)
		}

		// The next sign-in's claim drops ops and admins-pick: ops goes, the
		// admin's membership stays.
		if err := SyncOIDCTeams(ctx, db, ann.ID, []string{"eng", "new"}); err != nil {
			t.Fatal(err)
		}
		want = map[string]string{"eng": SourceOIDC, "new": SourceOIDC, "admins-pick": SourceAdmin}
		if got := memberSources(t, db, ann.ID); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("after the second sync: %v, want %v", got, want)
		}
		// An admin adding a provider's member makes the membership theirs.
		eng, _ := TeamByName(ctx, db, "eng")
		if err := AddTeamMember(ctx, db, eng.ID, ann.ID); err != nil {
			t.Fatal(err)
		}
		// No teams at all: only the admin's stay.
		if err := SyncOIDCTeams(ctx, db, ann.ID, nil); err != nil {
			t.Fatal(err)
		}
		want = map[string]string{"eng": SourceAdmin, "admins-pick": SourceAdmin}
		if got := memberSources(t, db, ann.ID); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("after an empty sync: %v, want %v", got, want)
		}
		if got := memberSources(t, db, bob.ID); fmt.Sprint(got) != fmt.Sprint(map[string]string{"eng": SourceOIDC}) {
			t.Errorf("bob's teams changed: %v", got)
		}

		// 150 groups: the first 100 taken, no error.
		many := make([]string, 150)
		for i := range many {
			many[i] = fmt.Sprintf("g%03d", i)
		}
		if err := SyncOIDCTeams(ctx, db, bob.ID, many); err != nil {
			t.Fatal(err)
		}
		got := memberSources(t, db, bob.ID)
		if len(got) != MaxOIDCTeams || got["g099"] != SourceOIDC || got["g100"] != "" {
			t.Errorf("150 groups gave %d memberships (g099 %q, g100 %q)", len(got), got["g099"], got["g100"])
		}
		db.Model(&Team{}).Where("name = ?", "g100").Count(&n)
		if n != 0 {
			t.Error("a team was made for a group beyond the first 100")
		}
	})
}
