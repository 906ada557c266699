package config

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// docs/configuration.md is the reference: it names every key the code
// knows (as `key`, or as the last part of a dotted `section.key`) and every
// environment variable that overrides one.
func TestReferenceDocumentsEveryKey(t *testing.T) {
	raw, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	for _, key := range yamlKeys(reflect.TypeOf(Config{})) {
		if !strings.Contains(doc, "`"+key+"`") && !strings.Contains(doc, "."+key+"`") && !strings.Contains(doc, "`"+key+".") {
			t.Errorf("docs/configuration.md does not mention %q", key)
		}
	}
	src, err := os.ReadFile("config.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, env := range regexp.MustCompile(`"(MOONJI_[A-Z_]+)"`).FindAllStringSubmatch(string(src), -1) {
		if !strings.Contains(doc, "`"+env[1]+"`") {
			t.Errorf("docs/configuration.md does not mention %s", env[1])
		}
	}
}
