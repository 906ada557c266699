package models

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"
)

// What the admin pages read of teams (handlers/admin_teams.go); team.go
// holds the teams themselves and what changes them.

// TeamByID finds team id.
func TeamByID(ctx context.Context, db *gorm.DB, id uint) (*Team, error) {
	var t Team
	err := db.WithContext(ctx).Where("id = ?", id).Take(&t).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find team %d: %w", id, err)
	}
	return &t, nil
}

// TeamMemberRow is one member of a team as its page lists them: who, and
// how they came to be in it (SourceAdmin or SourceOIDC).
type TeamMemberRow struct {
	UserID uint
	Email  string
	Source string
}

// TeamMemberRows lists at most limit members of team teamID by email, and
// whether there are more: a team a provider's claim fills may hold
// thousands, and its page shows a bounded list. One query.
func TeamMemberRows(ctx context.Context, db *gorm.DB, teamID uint, limit int) (rows []TeamMemberRow, more bool, err error) {
	err = db.WithContext(ctx).Table("team_members AS m").
		Joins("JOIN users AS u ON u.id = m.user_id").
		Select("m.user_id AS user_id, u.email AS email, m.source AS source").
		Where("m.team_id = ?", teamID).Order("u.email").Limit(limit + 1).Scan(&rows).Error
	if err != nil {
		return nil, false, fmt.Errorf("members of team %d: %w", teamID, err)
	}
	if len(rows) > limit {
		rows, more = rows[:limit], true
	}
	return rows, more, nil
}
