package attachment

import (
	"bytes"
	"path"
	"sort"
	"strings"
	"unicode/utf8"
)

// textExtensions are the file name endings of the text files that may be
// attached: plain text, Markdown, data and configuration formats, and
// source code. The name decides only among files whose bytes are text
// (valid UTF-8, no NUL): a PNG named notes.txt is still an image, and a
// binary named main.go is refused.
var textExtensions = map[string]bool{}

// textNames are whole file names of text files without an extension.
var textNames = map[string]bool{"makefile": true, "dockerfile": true, "readme": true, "license": true,
	"gemfile": true, "rakefile": true, "procfile": true, "justfile": true, "vagrantfile": true, "cmakelists.txt": true}

// textKinds says in a refusal which text files are allowed.
const textKinds = ".txt, .md, .csv, .json, .yaml, source code…"

func init() {
	for _, e := range strings.Fields(`
		txt text md markdown rst adoc org tex log csv tsv json jsonl ndjson yaml yml toml ini cfg conf env properties xml html htm css scss sass less svg
		go mod sum py pyi ipynb rb rs java kt kts scala groovy gradle c h cc cpp cxx hpp hh hxx m mm cs fs fsx vb swift dart
		js mjs cjs jsx ts tsx vue svelte php pl pm r jl lua sh bash zsh fish ps1 bat cmd sql graphql gql proto thrift
		ex exs erl hrl hs elm clj cljs edn lisp el scm ml mli nim zig v sv vhd tf hcl nix dockerfile makefile mk cmake
		diff patch gitignore gitattributes editorconfig lock srt vtt bib`) {
		textExtensions["."+e] = true
	}
	// SVG is text, but as a file it can carry scripts: it is attached as
	// text only, never served as an image (served files are sandboxed and
	// typed text/plain anyway).
}

// textName reports whether name is the name of a text file that may be
// attached.
func textName(name string) bool {
	lower := strings.ToLower(name)
	if textNames[lower] {
		return true
	}
	return textExtensions[path.Ext(lower)]
}

// checkText checks that data is text: valid UTF-8 without NUL.
func checkText(data []byte) *Error {
	if bytes.IndexByte(data, 0) >= 0 {
		return refuse(CodeBadText, "holds NUL bytes: it is not a text file.")
	}
	if !utf8.Valid(data) {
		return refuse(CodeBadText, "is not valid UTF-8 text (save it as UTF-8, or attach it as an image if it is one).")
	}
	return nil
}

// Accept is a file input's accept list: the image types and the text
// files' extensions (images false: text files only).
func Accept(images bool) string {
	exts := make([]string, 0, len(textExtensions))
	for e := range textExtensions {
		exts = append(exts, e)
	}
	sort.Strings(exts)
	list := strings.Join(exts, ",")
	if images {
		list = strings.Join([]string{MIMEPNG, MIMEJPEG, MIMEGIF, MIMEWebP}, ",") + "," + list
	}
	return list
}
