package assets

import (
	"bytes"
	"compress/gzip"
	"io"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/andybalholm/brotli"
)

func build(t *testing.T, files ...File) *Set {
	t.Helper()
	s, err := Build("/static/", files)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A file's URL carries its content's hash before the extension; the hashed
// name is found as immutable, the plain one as not, anything else not at all.
func TestURLAndLookup(t *testing.T) {
	css := []byte(strings.Repeat("body { color: red; }\n", 40))
	s := build(t, File{Name: "app.css", Body: css}, File{Name: "vendor/htmx.min.js", Body: []byte("htmx")})
	u := s.URL("app.css")
	if !strings.HasPrefix(u, "/static/app.") || !strings.HasSuffix(u, ".css") || len(u) != len("/static/app..css")+hashLen {
		t.Fatalf("URL = %q", u)
	}
	js := s.URL("vendor/htmx.min.js")
	if !strings.HasPrefix(js, "/static/vendor/htmx.min.") || !strings.HasSuffix(js, ".js") {
		t.Fatalf("URL = %q", js)
	}
	a, hashed, ok := s.Lookup(strings.TrimPrefix(u, "/static/"))
	if !ok || !hashed || a.Name != "app.css" || a.ContentType != "text/css; charset=utf-8" {
		t.Fatalf("hashed lookup: %+v %v %v", a, hashed, ok)
	}
	if a, hashed, ok := s.Lookup("app.css"); !ok || hashed || a.Name != "app.css" {
		t.Fatalf("plain lookup: %v %v", hashed, ok)
	}
	// Another release's hash: today's file, not as the hashed one.
	if a, hashed, ok := s.Lookup("app.0123456789.css"); !ok || hashed || a.Name != "app.css" {
		t.Fatalf("another hash's lookup: %v %v", hashed, ok)
	}
	for _, bad := range []string{"app.012345678g.css", "nothing.0123456789.css", "app." + a.Hash[:8] + ".css", "APP.css", "../app.css", "", "vendor/", "app.css/"} {
		if _, _, ok := s.Lookup(bad); ok {
			t.Errorf("%q found", bad)
		}
	}
	// Another content, another URL; the same content, the same URL.
	other := build(t, File{Name: "app.css", Body: append(css, ' ')})
	if other.URL("app.css") == u {
		t.Error("changed content kept its URL")
	}
	if again := build(t, File{Name: "app.css", Body: css}); again.URL("app.css") != u {
		t.Error("same content, another URL")
	}
	if got := s.URL("missing.css"); got != "/static/missing.css" {
		t.Errorf("unknown name: %q", got)
	}
}

// Each encoding decodes to the file's bytes; the encoding follows what the
// browser accepts; a tiny file is never compressed.
func TestEncodings(t *testing.T) {
	body := []byte(strings.Repeat("function f(){return 42}\n", 200))
	s := build(t, File{Name: "a.js", Body: body}, File{Name: "tiny.js", Body: []byte("x()")})
	a, _, _ := s.Lookup("a.js")
	for _, c := range []struct{ accept, want string }{
		{"gzip, deflate, br, zstd", "br"},
		{"gzip", "gzip"},
		{"br;q=0, gzip", "gzip"},
		{"br;q=0.5, gzip;q=0.9", "gzip"},
		{"", ""},
		{"identity", ""},
		{"*", "br"},
		{"*;q=0", ""},
		{"gzip;q=0, *", "br"},
		{"br;q=nonsense", ""},
	} {
		got, enc := a.Body(c.accept)
		if enc != c.want {
			t.Errorf("Accept-Encoding %q: %q, want %q", c.accept, enc, c.want)
			continue
		}
		if dec := decode(t, enc, got); !bytes.Equal(dec, body) {
			t.Errorf("Accept-Encoding %q: %s body decodes to other bytes", c.accept, enc)
		}
		if enc != "" && len(got) >= len(body)/3 {
			t.Errorf("%s: %d bytes of %d", enc, len(got), len(body))
		}
	}
	tiny, _, _ := s.Lookup("tiny.js")
	if got, enc := tiny.Body("br, gzip"); enc != "" || string(got) != "x()" {
		t.Errorf("tiny file: %q %q", enc, got)
	}
}

func decode(t *testing.T, enc string, b []byte) []byte {
	t.Helper()
	var r io.Reader = bytes.NewReader(b)
	switch enc {
	case "gzip":
		zr, err := gzip.NewReader(r)
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	case "br":
		r = brotli.NewReader(r)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestFromFSAndRefusals(t *testing.T) {
	files, err := FromFS(fstest.MapFS{"app.css": {Data: []byte("a")}, "static.go": {Data: []byte("package x")},
		"vendor/x.js": {Data: []byte("x")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 || files[0].Name != "app.css" || files[1].Name != "vendor/x.js" {
		t.Fatalf("files %+v", files)
	}
	for name, files := range map[string][]File{
		"twice":     {{Name: "a.css"}, {Name: "a.css"}},
		"absolute":  {{Name: "/a.css"}},
		"unclean":   {{Name: "x/../a.css"}},
		"empty":     {{Name: ""}},
		"collision": {{Name: "a.css", Body: []byte("a")}, {Name: "a." + hashOf("a") + ".css"}},
	} {
		if _, err := Build("/static/", files); err == nil {
			t.Errorf("%s: built", name)
		}
	}
	if _, err := Build("static", nil); err == nil {
		t.Error("prefix without slashes accepted")
	}
}

func hashOf(s string) string {
	set, _ := Build("/s/", []File{{Name: "x", Body: []byte(s)}})
	return set.All()[0].Hash
}

func TestCompressible(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/html; charset=utf-8": true, "application/json": true, "text/css": true,
		"text/event-stream": false, "Text/Event-Stream; charset=utf-8": false,
		"image/png": false, "": false, "application/octet-stream": false, "application/problem+json": true,
	} {
		if got := Compressible(ct); got != want {
			t.Errorf("%q: %v", ct, got)
		}
	}
}
