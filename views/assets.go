package views

import "moonji/static"

// asset is the URL of a static file, with its content hash (static.URL), so
// that browsers keep it until it changes.
func asset(name string) string { return static.URL(name) }
