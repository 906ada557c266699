package mockllm

import (
	"fmt"
	"strings"

	"github.com/tidwall/gjson"
)

// textInput is one input of a completions or embeddings request.
type textInput struct {
	// text picks the story or the vector; token ids are spelled out.
	text string
	// tokens is its length for usage: words for a text (at least one),
	// the count for token ids.
	tokens int
}

// textInputs reads the input forms that /v1/completions' "prompt" and
// /v1/embeddings' "input" share: a string, an array of strings, an array of
// token ids, or an array of arrays of token ids. An array of strings or of
// arrays holds several inputs; an array of token ids is one. Empty inputs
// are refused, as OpenAI refuses them; field names the field in errors.
func textInputs(v gjson.Result, field string) ([]textInput, error) {
	if v.Type == gjson.String {
		if v.String() == "" {
			return nil, fmt.Errorf("'%s' must not be empty", field)
		}
		return []textInput{wordsInput(v.String())}, nil
	}
	if !v.IsArray() {
		return nil, fmt.Errorf("'%s' must be a string, an array of strings, an array of token ids or an array of arrays of token ids", field)
	}
	items := v.Array()
	if len(items) == 0 {
		return nil, fmt.Errorf("'%s' must not be empty", field)
	}
	switch first := items[0]; {
	case first.Type == gjson.Number:
		ids, err := tokenIDs(v, field)
		if err != nil {
			return nil, err
		}
		return []textInput{ids}, nil
	case first.Type != gjson.String && !first.IsArray():
		return nil, fmt.Errorf("'%s' must be a string, an array of strings, an array of token ids or an array of arrays of token ids", field)
	}
	inputs := make([]textInput, len(items))
	for i, item := range items {
		name := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case items[0].IsArray() && item.IsArray():
			ids, err := tokenIDs(item, name)
			if err != nil {
				return nil, err
			}
			inputs[i] = ids
		case items[0].IsArray():
			return nil, fmt.Errorf("'%s' must be an array of token ids, like '%s[0]'", name, field)
		case item.Type != gjson.String:
			return nil, fmt.Errorf("'%s' must be a string, like '%s[0]'", name, field)
		case item.String() == "":
			return nil, fmt.Errorf("'%s' must not be empty", name)
		default:
			inputs[i] = wordsInput(item.String())
		}
	}
	return inputs, nil
}

func wordsInput(s string) textInput {
	return textInput{text: s, tokens: max(1, len(strings.Fields(s)))}
}

// tokenIDs reads a non-empty array of token ids (non-negative integers).
func tokenIDs(v gjson.Result, field string) (textInput, error) {
	items := v.Array()
	if len(items) == 0 {
		return textInput{}, fmt.Errorf("'%s' must not be empty", field)
	}
	ids := make([]string, len(items))
	for i, id := range items {
		if id.Type != gjson.Number || id.Float() != float64(id.Int()) || id.Int() < 0 {
			return textInput{}, fmt.Errorf("'%s[%d]' must be a token id (an integer of at least 0), got %s", field, i, id.Raw)
		}
		ids[i] = id.Raw
	}
	return textInput{text: "token ids " + strings.Join(ids, " "), tokens: len(ids)}, nil
}
