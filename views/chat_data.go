package views

import (
	"fmt"
	"net/url"
	"time"
)

// ChatPage is the chat: the new-chat page (/) when Conversation is empty,
// or one conversation (/c/{id}).
type ChatPage struct {
	Page
	Sidebar Sidebar
	// Conversation is the open conversation's id; empty on a new chat.
	Conversation string
	// Model is the model the next reply is written by.
	Model  string
	Models []string
	Thread ThreadData
	// Attach configures the composer's Attach control (attachments.templ).
	Attach AttachOptions
}

// ThreadData is the part of the path shown a page draws: its last
// messages, and Earlier (the first of them) when older ones are left for
// the "Show earlier messages" button, so that a long conversation's page
// stays light and quick.
type ThreadData struct {
	Conversation string
	Earlier      string
	Messages     []ChatMessage
}

// Sidebar lists the person's latest conversations (pinned first) and
// their folders.
type Sidebar struct {
	Conversations []ConversationLink
	// Current is the open conversation's id, marked in the list.
	Current string
	// More is set when older conversations exist (they are on /history).
	More bool
	// Folders are the person's folders, each listed with its conversations
	// of Conversations, and a place to drop one.
	Folders []string
	CSRF    string
	// Open is the conversation whose menu shows open (the one just acted
	// on), with Error saying why the action was refused, if it was.
	Open, Error string
}

// ConversationLink is one conversation in a list.
type ConversationLink struct {
	ID      string
	Title   string
	Model   string
	Updated time.Time
	Pinned  bool
	Folder  string // "" for none
}

// ChatMessage is one message of a conversation as the page shows it.
type ChatMessage struct {
	ID             string
	ConversationID string
	Role           string // user or assistant
	Status         string // streaming, done, stopped or error
	InferenceID    string
	Model          string
	// Text is a person's message, or the text so far of a streaming reply;
	// shown escaped.
	Text string
	// HTML is a finished reply rendered from Markdown and sanitized (the
	// same HTML as the events' done), trusted as is.
	HTML string
	// Seq is the number of chunks Text holds when Live.
	Seq int
	// Live means the reply streams on this replica: the page follows its
	// events from Seq. A streaming reply that is not live runs on another
	// replica: the page reloads its saved text every second.
	Live bool
	// Version of Versions is its place among its versions (edits of a
	// person's message, regenerated answers); PrevID and NextID are the
	// versions either side. Group names the set (its parent), stable
	// while switching, for the arrows' ids.
	Version, Versions int
	PrevID, NextID    string
	Group             string
	// Attachments are a person's message's files.
	Attachments []AttachmentView
}

// HistoryPage is /history: the person's conversations, searched.
type HistoryPage struct {
	Page
	Query string
	// Folder keeps the conversations of one folder ("": all); Folders are
	// the person's, to choose from.
	Folder        string
	Folders       []string
	Conversations []ConversationLink
	// Next continues the list (the link to older conversations), if any.
	Next  string
	Error string
	// Notice tells what the last action did (renamed, deleted).
	Notice string
}

// Title of a conversation as lists show it.
func titleOf(title string) string {
	if title == "" {
		return "New chat"
	}
	return title
}

// ConversationURL is the page of conversation id.
func ConversationURL(id string) string { return "/c/" + url.PathEscape(id) }

func messageURL(m ChatMessage) string {
	return fmt.Sprintf("/c/%s/m/%s", url.PathEscape(m.ConversationID), url.PathEscape(m.ID))
}

// messageActionURL is the page's endpoint of an action on message id.
func messageActionURL(m ChatMessage, id, action string) string {
	return fmt.Sprintf("/c/%s/m/%s/%s", url.PathEscape(m.ConversationID), url.PathEscape(id), action)
}

// deleteQuestion is what Delete asks before it deletes the person's
// message m: the answers after it go too, its other versions (if any) stay.
func deleteQuestion(m ChatMessage) string {
	if m.Versions > 1 {
		return "Delete this message and the answers after it? Its other versions stay."
	}
	return "Delete this message and the answers after it?"
}

func earlierURL(conv, before string) string {
	return ConversationURL(conv) + "/earlier?before=" + url.QueryEscape(before)
}

func eventsURL(m ChatMessage) string {
	return fmt.Sprintf("/api/v1/generations/%s/events?last_event_id=%d", url.PathEscape(m.InferenceID), m.Seq)
}

func exportURL(id, format string) string {
	return "/api/v1/conversations/" + url.PathEscape(id) + "/export?format=" + format
}

func historyURL(q, folder, cursor string) string {
	v := url.Values{}
	if q != "" {
		v.Set("q", q)
	}
	if folder != "" {
		v.Set("folder", folder)
	}
	if cursor != "" {
		v.Set("cursor", cursor)
	}
	if len(v) == 0 {
		return "/history"
	}
	return "/history?" + v.Encode()
}

// ago says how long ago t was, briefly.
func ago(t time.Time) string {
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return "just now"
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d/time.Minute))
	case d < 24*time.Hour:
		return fmt.Sprintf("%d h ago", int(d/time.Hour))
	case d < 7*24*time.Hour:
		return fmt.Sprintf("%d days ago", int(d/(24*time.Hour)))
	default:
		return t.UTC().Format("2006-01-02")
	}
}

func isoTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func itoa(n int) string { return fmt.Sprint(n) }

// statusNote says how a reply ended, when not simply done.
func statusNote(status string) string {
	switch status {
	case "stopped":
		return "Stopped"
	case "error":
		return "Failed"
	default:
		return ""
	}
}

// ExchangeData is the answer to a send: the new messages, and what changes
// elsewhere on the page.
type ExchangeData struct {
	Messages     []ChatMessage
	Sidebar      Sidebar
	Conversation string
	Title        string
	// Created: the conversation is new, the composer learns its id.
	Created bool
	// First: these are the conversation's first messages.
	First bool
}
