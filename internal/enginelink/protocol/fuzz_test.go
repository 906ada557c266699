package protocol

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzDecode throws arbitrary bytes at Decode, which must never panic,
// must refuse with a DecodeError, and, when it accepts, must accept again
// what Encode writes of the result, unchanged.
//
//	go test ./internal/enginelink/protocol -run '^$' -fuzz FuzzDecode -fuzztime 5m
func FuzzDecode(f *testing.F) {
	for _, s := range valid {
		f.Add([]byte(s))
	}
	for _, c := range invalid {
		f.Add([]byte(c.data))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := Decode(data)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("refusal is not a DecodeError: %v", err)
			}
			if de.ID != "" && checkID("id", de.ID) != nil {
				t.Fatalf("a refusal names an id of the wrong shape: %q", de.ID)
			}
			return
		}
		out, err := Encode(env)
		if err != nil {
			t.Fatalf("an accepted envelope does not encode: %v", err)
		}
		again, err := Decode(out)
		if err != nil {
			t.Fatalf("%q was accepted, its encoding %q is not: %v", data, out, err)
		}
		if !sameEnvelope(env, again) {
			t.Fatalf("round trip changed %q into %q", data, out)
		}
	})
}

func mustJSON(raw []byte) any {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		panic(err)
	}
	return v
}
