package chat

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"moonji/models"
)

// Finding conversations: a person pins them (pinned ones come first in
// every list) and puts them in folders, one level deep. A folder is a name
// on its conversations, so it exists while one is in it; a name is what
// the person typed, trimmed, compared exactly.

// Bounds of folders.
const (
	// MaxFolderChars bounds a folder's name: a label in a sidebar.
	MaxFolderChars = 64
	// MaxFolders bounds a person's folders: the sidebar lists them all,
	// each a place to drop a conversation.
	MaxFolders = 100
)

// ErrTooManyFolders refuses a new folder to a person who has MaxFolders.
var ErrTooManyFolders = models.ErrTooManyFolders

// CheckFolder returns name trimmed, or refuses it with a *SettingError of
// "folder": at most MaxFolderChars characters of valid UTF-8 with no
// control character, line separator or bidirectional override (a name is
// shown on one line, in lists of other names). "" means no folder.
func CheckFolder(name string) (string, error) {
	name = strings.TrimSpace(name)
	if !utf8.ValidString(name) {
		return "", &SettingError{"folder", "valid UTF-8 text"}
	}
	if utf8.RuneCountInString(name) > MaxFolderChars {
		return "", &SettingError{"folder", fmt.Sprintf("at most %d characters", MaxFolderChars)}
	}
	if strings.ContainsFunc(name, hiddenRune) {
		return "", &SettingError{"folder", "text without control characters"}
	}
	return name, nil
}

// hiddenRune tells the characters a folder's name may not hold: controls
// (C0, DEL, C1), line and paragraph separators, and the bidirectional
// embeddings, overrides and isolates, which would reorder the names shown
// after it.
func hiddenRune(r rune) bool {
	return unicode.IsControl(r) || r == '\u2028' || r == '\u2029' ||
		r >= '\u202a' && r <= '\u202e' || r >= '\u2066' && r <= '\u2069' || r == '\u200e' || r == '\u200f' || r == '\u061c'
}

// Change is what a change of a conversation sets, each field when not nil.
type Change struct {
	Title    *string
	Settings *models.ConversationSettings
	Pinned   *bool
	Folder   *string
}

// Change applies ch to the person's conversation id: everything is checked
// before anything is stored, and stored in one statement. A new folder
// past the person's MaxFolders is ErrTooManyFolders.
func (s *Service) Change(ctx context.Context, userID uint, id string, ch Change) error {
	mc := models.ConversationChange{Settings: ch.Settings, Pinned: ch.Pinned}
	if ch.Title != nil {
		title := strings.TrimSpace(*ch.Title)
		if utf8.RuneCountInString(title) > MaxTitleChars {
			return ErrTitleTooLong
		}
		mc.Title = &title
	}
	if ch.Settings != nil {
		if err := checkSettings(*ch.Settings); err != nil {
			return err
		}
	}
	if ch.Folder != nil {
		folder, err := CheckFolder(*ch.Folder)
		if err != nil {
			return err
		}
		mc.Folder = &folder
	}
	return models.ChangeConversation(ctx, s.o.DB, userID, id, mc, MaxFolders)
}

// Folders returns the names of the person's folders, in the order people
// read them (letters before case).
func (s *Service) Folders(ctx context.Context, userID uint) ([]string, error) {
	names, err := models.ConversationFolders(ctx, s.o.DB, userID, MaxFolders)
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(names, func(a, b string) int {
		if c := strings.Compare(strings.ToLower(a), strings.ToLower(b)); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	return names, nil
}
