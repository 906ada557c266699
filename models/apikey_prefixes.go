package models

import (
	"context"
	"fmt"

	"gorm.io/gorm"
)

// APIKeyPrefixes returns the prefixes of the keys with these ids, in one
// query, for lists of ledger rows that name keys by id. Unknown ids are
// left out.
func APIKeyPrefixes(ctx context.Context, db *gorm.DB, ids []uint) (map[uint]string, error) {
	out := make(map[uint]string, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	var rows []struct {
		ID     uint
		Prefix string
	}
	if err := db.WithContext(ctx).Model(&APIKey{}).Select("id", "prefix").Where("id IN ?", ids).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("key prefixes: %w", err)
	}
	for _, r := range rows {
		out[r.ID] = r.Prefix
	}
	return out, nil
}
