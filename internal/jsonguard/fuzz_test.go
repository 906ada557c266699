package jsonguard

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
)

// FuzzValidate checks Validate against encoding/json: the same verdict on
// every document nested at most MaxDepth deep, TooDeep beyond, and for the
// gateway's watch the same refusals as an independent reading of the keys
// with json.Decoder. It must never panic.
//
//	go test ./internal/jsonguard -run '^$' -fuzz FuzzValidate -fuzztime 2m
func FuzzValidate(f *testing.F) {
	for _, doc := range corpus(f) {
		f.Add([]byte(doc))
	}
	for _, doc := range []string{
		`{"model":"a","model":"b"}`, `{"model":"a","mod\u0065l":"b"}`, `{"MODEL":"a"}`, `{"ſtream":true}`,
		`{"stream_options":{"include_usage":true,"include_usage":false}}`, `{"max_to\u212Aens":1}`,
		`{"stream_options":[{"include_usage":1,"include_usage":2}]}`, `{"\ud83d\ude00":1,"\ud83d":2}`,
		`{"n":1,"n":2}`, `{"N":2}`, `{"tools":[],"tools":[{}]}`,
		`{"messages":[{"role":"user","content":"a","content":"b"}]}`, `{"messages":[1,{"role":"a"},{"role":"b","ROLE":"c"}]}`,
		`{"messages":[[{"content":1,"content":2}],{"tool_calls":[],"tool_c\u0061lls":[]}]}`,
		`{"messages":{"content":1,"content":2},"x":[{"role":1,"role":2}]}`,
		`{"messages":[{"content":[{"type":"text","text":"a","text":"b"}]}]}`,
	} {
		f.Add([]byte(doc))
	}
	f.Add(nest(MaxDepth, "[", "", "]"))
	f.Add(nest(MaxDepth+1, `{"a":`, "1", "}"))
	if b, err := os.ReadFile("testdata/chat_8k.json"); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := Validate(data, nil)
		var e *Error
		if err != nil && (!errors.As(err, &e) || e.Offset < 0 || e.Offset > len(data) || e.Error() == "") {
			t.Fatalf("Validate = %#v: not an *Error with an offset in the document", err)
		}
		if !json.Valid(data) {
			if err == nil {
				t.Fatalf("Validate accepted what encoding/json refuses: %q", data)
			}
			return
		}
		if d := depth(data); d > MaxDepth {
			if err == nil || e.Kind != TooDeep {
				t.Fatalf("%d levels deep: %v, want TooDeep", d, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("Validate refused what encoding/json accepts: %v", err)
		}
		werr := Validate(data, chatWatch)
		kind, field := watchOracle(t, data)
		if kind == 0 {
			if werr != nil {
				t.Fatalf("Validate with the watch = %v; the keys have no repeat", werr)
			}
			return
		}
		if !errors.As(werr, &e) || e.Kind != kind || e.Field != field {
			t.Fatalf("Validate with the watch = %#v; want kind %d on %q", werr, kind, field)
		}
	})
}

// depth returns how deep a valid document nests.
func depth(data []byte) int {
	d, deepest, inString := 0, 0, false
	for i := 0; i < len(data); i++ {
		switch c := data[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			d++
			deepest = max(deepest, d)
		case c == ']' || c == '}':
			d--
		}
	}
	return deepest
}

// watchOracle reads a valid document's keys with json.Decoder (which
// decodes escapes) and returns the first refusal chatWatch calls for, in
// document order: a key equal to a watched name only under case folding,
// or a watched key met twice.
func watchOracle(t *testing.T, data []byte) (Kind, string) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		object, wantKey bool
		parent          string // the watched field this object is the value of
		eachOf          string // the watched field this array is the value of
		elem            int    // the index of this array's current element
		elemPath        string // "messages[2]" for an object element of eachOf
		seen            map[string]bool
	}
	var stack []*frame
	lastKey := ""
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return 0, ""
		}
		if err != nil {
			t.Fatalf("json.Decoder on a valid document: %v", err)
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if key, ok := tok.(string); ok && top != nil && top.object && top.wantKey {
			top.wantKey = false
			lastKey = ""
			var names []string
			switch {
			case len(stack) == 1:
				for _, f := range chatWatch {
					names = append(names, f.Name)
				}
			case len(stack) == 2 && top.parent != "":
				for _, f := range chatWatch {
					if f.Name == top.parent {
						names = f.Inner
					}
				}
			case len(stack) == 3 && top.elemPath != "":
				for _, f := range chatWatch {
					if strings.HasPrefix(top.elemPath, f.Name+"[") {
						names = f.Each
					}
				}
			}
			for _, name := range names {
				path := name
				switch {
				case top.parent != "":
					path = top.parent + "." + name
				case top.elemPath != "":
					path = top.elemPath + "." + name
				}
				if key != name && strings.EqualFold(key, name) {
					return CaseVariant, path
				}
				if key == name {
					if top.seen[name] {
						return Duplicate, path
					}
					top.seen[name] = true
					lastKey = name
				}
			}
			continue
		}
		// A value, or the end of a container.
		closing := tok == json.Delim('}') || tok == json.Delim(']')
		if !closing && top != nil && top.eachOf != "" {
			top.elem++
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			f := &frame{object: tok == json.Delim('{'), wantKey: tok == json.Delim('{'), elem: -1, seen: map[string]bool{}}
			if len(stack) == 1 && top.object {
				for _, w := range chatWatch {
					if w.Name == lastKey && f.object && len(w.Inner) > 0 {
						f.parent = lastKey
					}
					if w.Name == lastKey && !f.object && len(w.Each) > 0 {
						f.eachOf = lastKey
					}
				}
			}
			if len(stack) == 2 && top.eachOf != "" && f.object {
				f.elemPath = top.eachOf + "[" + strconv.Itoa(top.elem) + "]"
			}
			stack = append(stack, f)
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].wantKey = true
		}
	}
}
