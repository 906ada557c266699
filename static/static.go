// Package static embeds Moonji's browser assets: its stylesheet, its few
// lines of script, and the vendored htmx (copied from node_modules by
// scripts/vendor.mjs). They are served at /static/; nothing comes from a CDN.
package static

import "embed"

// FS holds the files of this directory that browsers load.
//
//go:embed *.css *.js vendor
var FS embed.FS
