package markdown

import (
	"regexp"
	"slices"
	"strings"

	"github.com/alecthomas/chroma/v2"
	"github.com/microcosm-cc/bluemonday"
)

// newPolicy returns the sanitizer for what the renderer emits: bluemonday's
// UGC policy (no script, no event handlers, no style, URLs http, https or
// mailto only), plus the code container, chroma's classes and task-list
// checkboxes, each attribute matched to the exact values the renderer
// writes. The UGC policy allows <img> (absolute http and https sources
// only here): with Options.Images off the renderer writes none, and
// bluemonday has no way to take an element back out of a policy.
func newPolicy() *bluemonday.Policy {
	p := bluemonday.UGCPolicy()

	// Links: absolute only. A relative link in an answer would resolve
	// against the chat page and could point at the gateway's own routes.
	p.AllowRelativeURLs(false)
	p.RequireNoFollowOnLinks(true)
	p.RequireNoReferrerOnLinks(true)
	// Adds target="_blank" and rel="noopener"; every link is absolute.
	p.AddTargetBlankToFullyQualifiedLinks(true)

	// The code container.
	p.AllowAttrs("class").Matching(regexp.MustCompile(`^(code|code-head)$`)).OnElements("div")
	p.AllowAttrs("type").Matching(regexp.MustCompile(`^button$`)).OnElements("button")
	p.AllowAttrs("class").Matching(regexp.MustCompile(`^copy$`)).OnElements("button")
	p.AllowAttrs("aria-label").Matching(regexp.MustCompile(`^Copy code$`)).OnElements("button")
	p.AllowAttrs("class").Matching(regexp.MustCompile(`^(chroma|plain)$`)).OnElements("pre")
	// A code block scrolls sideways: keyboards must reach it.
	p.AllowAttrs("tabindex").Matching(regexp.MustCompile(`^0$`)).OnElements("pre")
	p.AllowAttrs("class").Matching(regexp.MustCompile(`^language-[a-z0-9+#._-]{1,32}$`)).OnElements("code")
	p.AllowAttrs("class").Matching(spanClasses()).OnElements("span")

	// Task lists: goldmark writes <input checked="" disabled="" type="checkbox">.
	p.AllowAttrs("type").Matching(regexp.MustCompile(`^checkbox$`)).OnElements("input")
	p.AllowAttrs("checked", "disabled").Matching(regexp.MustCompile(`^$`)).OnElements("input")
	return p
}

// spanClasses matches the class of a <span>: the code label, or one of
// chroma's token classes, exactly.
func spanClasses() *regexp.Regexp {
	names := []string{"code-lang"}
	for _, c := range chroma.StandardTypes {
		if c != "" {
			names = append(names, regexp.QuoteMeta(c))
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	return regexp.MustCompile(`^(` + strings.Join(names, "|") + `)$`)
}
