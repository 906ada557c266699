package views

import "net/url"

// The sidebar's groups: pinned conversations first, then each folder's
// others, then those in no folder.

// pinned are the sidebar's pinned conversations, whatever their folder.
func (s Sidebar) pinned() []ConversationLink {
	return s.pick(func(c ConversationLink) bool { return c.Pinned })
}

// inFolder are the sidebar's conversations in folder that are not pinned.
func (s Sidebar) inFolder(folder string) []ConversationLink {
	return s.pick(func(c ConversationLink) bool { return !c.Pinned && c.Folder == folder })
}

func (s Sidebar) pick(keep func(ConversationLink) bool) []ConversationLink {
	var out []ConversationLink
	for _, c := range s.Conversations {
		if keep(c) {
			out = append(out, c)
		}
	}
	return out
}

// folderURL is the history of one folder.
func folderURL(folder string) string { return historyURL("", folder, "") }

// pinURL and folderFormURL are where a conversation's menu posts.
func pinURL(id string) string        { return "/c/" + url.PathEscape(id) + "/pin" }
func folderFormURL(id string) string { return "/c/" + url.PathEscape(id) + "/folder" }

// pinValue is what a Pin or Unpin button asks for.
func pinValue(pinned bool) string {
	if pinned {
		return "0"
	}
	return "1"
}

// unfiledName names the group of conversations in no folder.
func unfiledName(s Sidebar) string {
	if len(s.Folders) > 0 {
		return "No folder"
	}
	return "Recent conversations"
}
