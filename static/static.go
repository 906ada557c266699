// Package static embeds Moonji's browser assets: its stylesheet, its few
// lines of script, and the vendored htmx (copied from node_modules by
// scripts/vendor.mjs). They are served at /static/ under hashed URLs (see
// internal/assets); nothing comes from a CDN.
package static

import (
	"embed"
	"fmt"
	"sync"

	"moonji/internal/assets"
	"moonji/internal/markdown"
)

// FS holds the files of this directory that browsers load.
//
//go:embed *.css *.js vendor
var FS embed.FS

// Prefix is where the assets are served.
const Prefix = "/static/"

// Assets is the set browsers load: this directory's files and the code
// colours' stylesheet that internal/markdown generates (markdown.css),
// hashed and compressed once per process, on first use (the server asks
// for it as it starts, so no request pays for it).
var Assets = sync.OnceValues(func() (*assets.Set, error) {
	files, err := assets.FromFS(FS)
	if err != nil {
		return nil, err
	}
	files = append(files, assets.File{Name: "markdown.css", Body: []byte(markdown.CSS())})
	set, err := assets.Build(Prefix, files)
	if err != nil {
		return nil, fmt.Errorf("static assets: %w", err)
	}
	return set, nil
})

// URL is the URL of the named asset ("app.css", "vendor/htmx.min.js"),
// carrying its content hash. Pages take every asset URL from here.
func URL(name string) string {
	set, err := Assets()
	if err != nil {
		return Prefix + name // the server refused to start on this error
	}
	return set.URL(name)
}
