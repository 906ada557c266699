// Package assets serves a fixed set of browser files (stylesheets, scripts)
// under URLs that carry a hash of their content, so that browsers may keep
// them for a year without asking again: a new version is a new URL. Each
// file is hashed and compressed once, when the set is built, never per
// request. It knows nothing of HTTP servers: the web package serves it.
package assets

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"mime"
	"path"
	"sort"
	"strings"

	"github.com/andybalholm/brotli"
)

// hashLen is the hex digits of SHA-256 a URL carries: 40 bits tell one
// version of a file from its others, which is all they have to do.
const hashLen = 10

// brotliLevel is the level files are compressed at when the set is built.
// Level 11 would save another 8 % at 30 times the cost (2 s for Chart.js on
// this project's machines), paid by every start of every replica and test.
const brotliLevel = 6

// minCompress is the size under which a file is sent as it is: a smaller
// one barely shrinks, and may grow.
const minCompress = 256

// File is a file to serve: its name below the prefix ("app.css",
// "vendor/htmx.min.js") and its bytes.
type File struct {
	Name string
	Body []byte
}

// Asset is one file of a set, with its URL and its compressed forms.
type Asset struct {
	// Name is the file's name below the prefix, as URL takes it.
	Name string
	// Path is the URL carrying the content hash: /static/app.3f9a1c2b0e.css.
	Path string
	// Hash is the hex digest Path carries.
	Hash        string
	ContentType string
	// ETag is a weak validator: every encoding of the file shares it.
	ETag   string
	body   []byte
	gzip   []byte // nil when it would not be smaller
	brotli []byte // nil when it would not be smaller
}

// Set is a built set of assets, safe for concurrent use.
type Set struct {
	prefix   string
	byName   map[string]*Asset
	byHashed map[string]*Asset
	list     []*Asset
}

// FromFS reads every regular file of fsys (an embed.FS, say), skipping Go
// sources.
func FromFS(fsys fs.FS) ([]File, error) {
	var files []File
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || strings.HasSuffix(p, ".go") {
			return nil
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		files = append(files, File{Name: p, Body: b})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read assets: %w", err)
	}
	return files, nil
}

// Build hashes and compresses files, to be served below prefix ("/static/").
func Build(prefix string, files []File) (*Set, error) {
	if !strings.HasPrefix(prefix, "/") || !strings.HasSuffix(prefix, "/") {
		return nil, fmt.Errorf("asset prefix %q must start and end with /", prefix)
	}
	s := &Set{prefix: prefix, byName: map[string]*Asset{}, byHashed: map[string]*Asset{}}
	for _, f := range files {
		if f.Name == "" || strings.HasPrefix(f.Name, "/") || path.Clean(f.Name) != f.Name {
			return nil, fmt.Errorf("asset name %q is not a clean relative path", f.Name)
		}
		if _, dup := s.byName[f.Name]; dup {
			return nil, fmt.Errorf("asset %q given twice", f.Name)
		}
		sum := sha256.Sum256(f.Body)
		h := hex.EncodeToString(sum[:])[:hashLen]
		a := &Asset{Name: f.Name, Hash: h, ContentType: contentType(f.Name), ETag: `W/"` + h + `"`, body: f.Body}
		hashed := hashedName(f.Name, h)
		a.Path = prefix + hashed
		if compressible(a.ContentType) && len(f.Body) >= minCompress {
			var err error
			if a.gzip, err = gzipped(f.Body); err != nil {
				return nil, fmt.Errorf("compress %s: %w", f.Name, err)
			}
			if a.brotli, err = brotlied(f.Body); err != nil {
				return nil, fmt.Errorf("compress %s: %w", f.Name, err)
			}
		}
		s.byName[f.Name] = a
		s.byHashed[hashed] = a
		s.list = append(s.list, a)
	}
	// A file literally named like another's hashed URL would make that URL
	// ambiguous.
	for name := range s.byName {
		if other, ok := s.byHashed[name]; ok && other.Name != name {
			return nil, fmt.Errorf("asset %q collides with the hashed name of %q", name, other.Name)
		}
	}
	sort.Slice(s.list, func(i, j int) bool { return s.list[i].Name < s.list[j].Name })
	return s, nil
}

// URL is the hashed URL of the named asset. An unknown name gets its plain
// URL, which then answers 404: a typo in a page shows up as a missing file
// (and in the tests that fetch every file a page names), not a broken page.
func (s *Set) URL(name string) string {
	if a, ok := s.byName[name]; ok {
		return a.Path
	}
	return s.prefix + name
}

// Lookup finds the asset at rel, a path below the prefix. hashed tells
// whether rel is the asset's hashed name (cacheable forever) or its plain
// name, kept working for pages older than the hashes.
func (s *Set) Lookup(rel string) (a *Asset, hashed, ok bool) {
	if a, ok := s.byHashed[rel]; ok {
		return a, true, true
	}
	if a, ok := s.byName[rel]; ok {
		return a, false, true
	}
	// Another version's hash: during a rolling deploy a page from one
	// replica names files by hashes another does not have. Its current
	// file, briefly cached, beats a page without styles or scripts.
	if name, ok := unhashedName(rel); ok {
		if a, ok := s.byName[name]; ok {
			return a, false, true
		}
	}
	return nil, false, false
}

// unhashedName undoes hashedName for any hash of the right shape.
func unhashedName(rel string) (string, bool) {
	dir, file := path.Split(rel)
	ext := strings.LastIndexByte(file, '.')
	if ext < 0 {
		return "", false
	}
	dot := strings.LastIndexByte(file[:ext], '.')
	if dot <= 0 || ext-dot-1 != hashLen {
		return "", false
	}
	for _, r := range file[dot+1 : ext] {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return "", false
		}
	}
	return dir + file[:dot] + file[ext:], true
}

// All lists the set's assets by name.
func (s *Set) All() []*Asset { return append([]*Asset(nil), s.list...) }

// Body is the file in the best encoding acceptEncoding (a request's
// Accept-Encoding header) allows: "br", "gzip" or "" for the file as it is.
func (a *Asset) Body(acceptEncoding string) (body []byte, encoding string) {
	switch Negotiate(acceptEncoding) {
	case "br":
		if a.brotli != nil {
			return a.brotli, "br"
		}
		if a.gzip != nil && accepts(acceptEncoding, "gzip") {
			return a.gzip, "gzip"
		}
	case "gzip":
		if a.gzip != nil {
			return a.gzip, "gzip"
		}
	}
	return a.body, ""
}

// Compressible says whether a response of this content type gains from
// compression: text, JSON, JavaScript, SVG. Event streams are excluded:
// compressing one would hold its events back until a block fills.
func Compressible(contentType string) bool { return compressible(contentType) }

func compressible(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	switch {
	case mt == "text/event-stream":
		return false
	case strings.HasPrefix(mt, "text/"):
		return true
	case mt == "application/json", mt == "application/javascript", mt == "image/svg+xml",
		mt == "application/xml", mt == "application/manifest+json", strings.HasSuffix(mt, "+json"):
		return true
	}
	return false
}

// contentType is the type a browser needs for a file: stylesheets and
// scripts are refused under any other with nosniff.
func contentType(name string) string {
	switch path.Ext(name) {
	case ".css":
		return "text/css; charset=utf-8"
	case ".js", ".mjs":
		return "text/javascript; charset=utf-8"
	case ".json", ".map":
		return "application/json"
	case ".svg":
		return "image/svg+xml"
	}
	if t := mime.TypeByExtension(path.Ext(name)); t != "" {
		return t
	}
	return "application/octet-stream"
}

// hashedName puts the hash before the last extension:
// vendor/htmx.min.js → vendor/htmx.min.<hash>.js.
func hashedName(name, hash string) string {
	dir, file := path.Split(name)
	if i := strings.LastIndexByte(file, '.'); i > 0 {
		return dir + file[:i] + "." + hash + file[i:]
	}
	return name + "." + hash
}

// gzipped and brotlied keep a compressed form only when it is smaller.
func gzipped(b []byte) ([]byte, error) {
	var out bytes.Buffer
	w, err := gzip.NewWriterLevel(&out, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(b); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	if out.Len() >= len(b) {
		return nil, nil
	}
	return out.Bytes(), nil
}

func brotlied(b []byte) ([]byte, error) {
	var out bytes.Buffer
	w := brotli.NewWriterLevel(&out, brotliLevel)
	if _, err := w.Write(b); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	if out.Len() >= len(b) {
		return nil, nil
	}
	return out.Bytes(), nil
}
