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

// Team is a group of people with a budget over everything its members spend
// and the models they may use. An admin makes teams and adds people to them
// (the CLI), and an OIDC provider's teams claim places people in teams of
// its names at each sign-in (SyncOIDCTeams).
type Team struct {
	ID   uint   `gorm:"primaryKey"`
	Name string `gorm:"size:100;uniqueIndex"`
	// Budget is in nano-units of the currency; nil: none.
	Budget       *int64
	BudgetPeriod string `gorm:"size:8"` // BudgetDay, BudgetMonth or BudgetTotal; "" without a budget
	// Models are the models the members may use, comma-separated; "": all.
	Models    string
	CreatedAt time.Time
}

// Sources of a team membership.
const (
	SourceAdmin = "admin" // an admin added the person; only an admin removes them
	SourceOIDC  = "oidc"  // the provider's teams claim: replaced at each sign-in
)

// TeamMember is one person in one team.
type TeamMember struct {
	TeamID    uint   `gorm:"primaryKey;autoIncrement:false"`
	UserID    uint   `gorm:"primaryKey;autoIncrement:false;index"`
	Team      Team   `gorm:"constraint:OnDelete:CASCADE"`
	User      User   `gorm:"constraint:OnDelete:CASCADE"`
	Source    string `gorm:"size:8"`
	CreatedAt time.Time
}

// MaxTeamNameLen bounds a team's name, in characters.
const MaxTeamNameLen = 100

// MaxOIDCTeams is how many of a teams claim's names SyncOIDCTeams takes;
// the rest are ignored.
const MaxOIDCTeams = 100

// CheckTeamName returns a team's name trimmed, or an error wrapping
// ErrInvalid: empty, over MaxTeamNameLen characters, not UTF-8, or with a
// control or invisible formatting character.
func CheckTeamName(name string) (string, error) {
	name = strings.TrimSpace(name)
	switch {
	case name == "":
		return "", fmt.Errorf("%w team name: empty", ErrInvalid)
	case !utf8.ValidString(name):
		return "", fmt.Errorf("%w team name: not UTF-8", ErrInvalid)
	case utf8.RuneCountInString(name) > MaxTeamNameLen:
		return "", fmt.Errorf("%w team name: over %d characters", ErrInvalid, MaxTeamNameLen)
	case hasControl(name):
		return "", fmt.Errorf("%w team name %q: a control character", ErrInvalid, name)
	}
	return name, nil
}

// ErrTeamExists is returned by CreateTeam for a name already taken.
var ErrTeamExists = errors.New("a team of this name exists")

// CreateTeam stores a new team named name with limits (see Limits.Check).
func CreateTeam(ctx context.Context, db *gorm.DB, name string, limits Limits) (*Team, error) {
	name, err := CheckTeamName(name)
	if err != nil {
		return nil, err
	}
	if limits, err = limits.Check(); err != nil {
		return nil, err
	}
	t := &Team{Name: name, Budget: limits.Budget, BudgetPeriod: limits.BudgetPeriod, Models: limits.Models}
	res := db.WithContext(ctx).Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "name"}}, DoNothing: true}).Create(t)
	if res.Error != nil {
		return nil, fmt.Errorf("create team %q: %w", name, res.Error)
	}
	if res.RowsAffected == 0 {
		return nil, fmt.Errorf("%w: %q", ErrTeamExists, name)
	}
	return t, nil
}

// TeamByName finds a team by its name (trimmed).
func TeamByName(ctx context.Context, db *gorm.DB, name string) (*Team, error) {
	var t Team
	err := db.WithContext(ctx).Where("name = ?", strings.TrimSpace(StorableText(name))).Take(&t).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find team: %w", err)
	}
	return &t, nil
}

// TeamInfo is one row of the list of teams: a team and its number of members.
type TeamInfo struct {
	Team
	Members int64
}

// ListTeams lists every team by name, with its members counted: two queries.
func ListTeams(ctx context.Context, db *gorm.DB) ([]TeamInfo, error) {
	var teams []Team
	if err := db.WithContext(ctx).Order("name").Find(&teams).Error; err != nil {
		return nil, fmt.Errorf("list teams: %w", err)
	}
	var counts []struct {
		TeamID uint
		N      int64
	}
	err := db.WithContext(ctx).Model(&TeamMember{}).Select("team_id, COUNT(*) AS n").Group("team_id").Scan(&counts).Error
	if err != nil {
		return nil, fmt.Errorf("count team members: %w", err)
	}
	n := make(map[uint]int64, len(counts))
	for _, c := range counts {
		n[c.TeamID] = c.N
	}
	out := make([]TeamInfo, len(teams))
	for i, t := range teams {
		out[i] = TeamInfo{Team: t, Members: n[t.ID]}
	}
	return out, nil
}

// AddTeamMember puts user userID in team teamID as an admin's member: one
// the provider's claim had placed there becomes an admin's, which sign-ins
// no longer remove. Adding twice is harmless.
func AddTeamMember(ctx context.Context, db *gorm.DB, teamID, userID uint) error {
	m := TeamMember{TeamID: teamID, UserID: userID, Source: SourceAdmin}
	err := db.WithContext(ctx).Clauses(clause.OnConflict{
		Columns:   []clause.Column{{Name: "team_id"}, {Name: "user_id"}},
		DoUpdates: clause.Assignments(map[string]any{"source": SourceAdmin}),
	}).Omit(clause.Associations).Create(&m).Error
	if err != nil {
		return fmt.Errorf("add user %d to team %d: %w", userID, teamID, err)
	}
	return nil
}

// RemoveTeamMember takes user userID out of team teamID, whoever put them
// there (a provider's claim that names the team again puts them back at
// their next sign-in). ErrNotFound when they were not in it.
func RemoveTeamMember(ctx context.Context, db *gorm.DB, teamID, userID uint) error {
	res := db.WithContext(ctx).Where("team_id = ? AND user_id = ?", teamID, userID).Delete(&TeamMember{})
	if res.Error != nil {
		return fmt.Errorf("remove user %d from team %d: %w", userID, teamID, res.Error)
	}
	if res.RowsAffected == 0 {
		return ErrNotFound
	}
	return nil
}

// TeamsOf lists the teams user userID is in, by name.
func TeamsOf(ctx context.Context, db *gorm.DB, userID uint) ([]Team, error) {
	var teams []Team
	err := db.WithContext(ctx).
		Where("id IN (?)", db.WithContext(ctx).Model(&TeamMember{}).Select("team_id").Where("user_id = ?", userID)).
		Order("name").Find(&teams).Error
	if err != nil {
		return nil, fmt.Errorf("teams of user %d: %w", userID, err)
	}
	return teams, nil
}

// MembersOf lists the members of team teamID, by email.
func MembersOf(ctx context.Context, db *gorm.DB, teamID uint) ([]User, error) {
	var users []User
	err := db.WithContext(ctx).
		Where("id IN (?)", db.WithContext(ctx).Model(&TeamMember{}).Select("user_id").Where("team_id = ?", teamID)).
		Order("email").Find(&users).Error
	if err != nil {
		return nil, fmt.Errorf("members of team %d: %w", teamID, err)
	}
	return users, nil
}

// SetTeamBudget sets the budget of team id (nil and "": none).
func SetTeamBudget(ctx context.Context, db *gorm.DB, id uint, budget *int64, period string) error {
	set, err := budgetColumns(budget, period)
	if err != nil {
		return err
	}
	return setColumns(ctx, db, &Team{}, "budget of team", id, set)
}

// SetTeamModels sets the models team id's members may use (a
// comma-separated list, "" for all; see ParseModelList).
func SetTeamModels(ctx context.Context, db *gorm.DB, id uint, list string) error {
	norm, err := normalizeModelList(list)
	if err != nil {
		return err
	}
	return setColumns(ctx, db, &Team{}, "models of team", id, map[string]any{"models": norm})
}

// DeleteTeam deletes team id and its memberships.
func DeleteTeam(ctx context.Context, db *gorm.DB, id uint) error {
	var deleted int64
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Where("team_id = ?", id).Delete(&TeamMember{}).Error; err != nil {
			return err
		}
		res := tx.Delete(&Team{}, id)
		deleted = res.RowsAffected
		return res.Error
	})
	if err != nil {
		return fmt.Errorf("delete team %d: %w", id, err)
	}
	if deleted == 0 {
		return ErrNotFound
	}
	return nil
}

// oidcTeamNames are the distinct valid names of a teams claim, the first
// MaxOIDCTeams of them; invalid names are skipped.
func oidcTeamNames(names []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, n := range names {
		if len(out) == MaxOIDCTeams {
			break
		}
		name, err := CheckTeamName(n)
		if err != nil || seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, name)
	}
	return out
}

// SyncOIDCTeams makes user userID's memberships from the provider (Source
// "oidc") exactly the teams named: teams that do not exist are created
// (without budget, every model), memberships the names no longer give are
// removed, and an admin's memberships are never touched (a team the claim
// names and an admin added stays the admin's). Invalid names (empty, over
// MaxTeamNameLen characters, control characters) and names beyond the
// first MaxOIDCTeams are ignored. One transaction.
func SyncOIDCTeams(ctx context.Context, db *gorm.DB, userID uint, names []string) error {
	names = oidcTeamNames(names)
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var want []uint
		if len(names) > 0 {
			// Create the missing teams; one another sign-in creates at the
			// same time is found by the SELECT that follows.
			teams := make([]Team, len(names))
			for i, n := range names {
				teams[i] = Team{Name: n}
			}
			err := tx.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "name"}}, DoNothing: true}).
				Create(&teams).Error
			if err != nil {
				return fmt.Errorf("create teams: %w", err)
			}
			if err := tx.Model(&Team{}).Where("name IN ?", names).Pluck("id", &want).Error; err != nil {
				return fmt.Errorf("find teams: %w", err)
			}
			members := make([]TeamMember, len(want))
			for i, id := range want {
				members[i] = TeamMember{TeamID: id, UserID: userID, Source: SourceOIDC}
			}
			err = tx.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "team_id"}, {Name: "user_id"}}, DoNothing: true}).
				Omit(clause.Associations).Create(&members).Error
			if err != nil {
				return fmt.Errorf("add memberships: %w", err)
			}
		}
		q := tx.Where("user_id = ? AND source = ?", userID, SourceOIDC)
		if len(want) > 0 {
			q = q.Where("team_id NOT IN ?", want)
		}
		if err := q.Delete(&TeamMember{}).Error; err != nil {
			return fmt.Errorf("remove memberships: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sync teams of user %d: %w", userID, err)
	}
	return nil
}
