package protocol

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The published JSON Schema (docs/engine-protocol.schema.json) and Decode
// agree on every envelope of the tests and of the fuzz corpus, except where
// the schema cannot say it (size, depth).
func TestSchemaAgreesWithDecode(t *testing.T) {
	path := filepath.Join("..", "..", "..", "docs", "engine-protocol.schema.json")
	c := jsonschema.NewCompiler()
	sch, err := c.Compile(path)
	if err != nil {
		t.Fatalf("compile %s: %v", path, err)
	}
	docs := map[string][]byte{}
	for _, s := range valid {
		docs[s] = []byte(s)
	}
	for _, bad := range invalid {
		if bad.name == "deep" {
			continue // depth: Decode's alone
		}
		docs[bad.data] = []byte(bad.data)
	}
	corpus, _ := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzDecode", "*"))
	for _, f := range corpus {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if data, ok := corpusBytes(raw); ok {
			docs[f] = data
		}
	}
	checked := 0
	for _, data := range docs {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
		if err != nil {
			continue // not JSON: the schema has nothing to say
		}
		_, decodeErr := Decode(data)
		schemaErr := sch.Validate(doc)
		if (decodeErr == nil) != (schemaErr == nil) {
			t.Errorf("%.120q:\n  Decode: %v\n  schema: %v", data, decodeErr, schemaErr)
		}
		checked++
	}
	if checked < len(valid)+len(invalid)-1 {
		t.Fatalf("only %d documents checked", checked)
	}
}

// corpusBytes reads a file of Go's fuzz corpus ("go test fuzz v1" and one
// []byte("…") line).
func corpusBytes(raw []byte) ([]byte, bool) {
	lines := bytes.SplitN(raw, []byte("\n"), 2)
	if len(lines) != 2 || !bytes.HasPrefix(lines[0], []byte("go test fuzz v1")) {
		return nil, false
	}
	line := bytes.TrimSpace(lines[1])
	if !bytes.HasPrefix(line, []byte("[]byte(")) || !bytes.HasSuffix(line, []byte(")")) {
		return nil, false
	}
	s, err := strconv.Unquote(string(line[len("[]byte(") : len(line)-1]))
	if err != nil {
		return nil, false
	}
	return []byte(s), true
}
