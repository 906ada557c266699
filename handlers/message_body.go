package handlers

import (
	"fmt"

	"github.com/tidwall/gjson"

	"moonji/internal/jsonguard"
)

// maxAttachmentIDs bounds attachment_ids in any body, before the
// configured maximum per message (at most this) words its own refusal.
const maxAttachmentIDs = 16

// maxAttachmentID bounds one id ("a_" and 26 characters).
const maxAttachmentID = 64

var messageWatch = jsonguard.Watch{{Name: "content"}, {Name: "attachment_ids"}}

// messageBody is a message to send: its text and the ids of its
// attachments.
type messageBody struct {
	Content       string
	AttachmentIDs []string
}

// parseMessageBody reads {"content": "...", "attachment_ids": ["a_…"]}:
// content a string (required), attachment_ids optional (missing or null),
// an array of at most maxAttachmentIDs strings; other members are ignored.
func parseMessageBody(body []byte) (messageBody, error) {
	var out messageBody
	root, err := guardedObject(body, messageWatch)
	if err != nil {
		return out, err
	}
	v := root.Get("content")
	if v.Type != gjson.String {
		return out, &bodyError{Message: "content must be a string", Param: "content"}
	}
	out.Content = v.Str
	ids := root.Get("attachment_ids")
	if ids.Type == gjson.Null {
		return out, nil
	}
	if !ids.IsArray() {
		return out, &bodyError{Message: "attachment_ids must be an array of attachment ids", Param: "attachment_ids"}
	}
	i := 0
	ids.ForEach(func(_, id gjson.Result) bool {
		switch {
		case i >= maxAttachmentIDs:
			err = &bodyError{Message: fmt.Sprintf("attachment_ids may hold at most %d ids", maxAttachmentIDs), Param: "attachment_ids"}
		case id.Type != gjson.String || id.Str == "" || len(id.Str) > maxAttachmentID:
			err = &bodyError{Message: "attachment_ids must hold attachment ids (strings, as POST /api/v1/attachments returns them)",
				Param: fmt.Sprintf("attachment_ids[%d]", i)}
		default:
			out.AttachmentIDs = append(out.AttachmentIDs, id.Str)
		}
		i++
		return err == nil
	})
	return out, err
}

// formAttachmentIDs checks the attachment ids of the composer's form (its
// attachment_ids fields) as parseMessageBody does.
func formAttachmentIDs(values [][]byte) ([]string, error) {
	if len(values) > maxAttachmentIDs {
		return nil, &bodyError{Message: fmt.Sprintf("A message may carry at most %d attachments.", maxAttachmentIDs)}
	}
	var out []string
	for _, v := range values {
		if len(v) == 0 || len(v) > maxAttachmentID {
			return nil, &bodyError{Message: "An attachment is unknown: attach the file again."}
		}
		out = append(out, string(v))
	}
	return out, nil
}
