package markdown

import (
	"bytes"
	"html"
	"strings"
	"sync"

	"github.com/alecthomas/chroma/v2"
	chromahtml "github.com/alecthomas/chroma/v2/formatters/html"
	"github.com/alecthomas/chroma/v2/lexers"
	"github.com/alecthomas/chroma/v2/styles"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/renderer"
	"github.com/yuin/goldmark/util"
)

// maxHighlight bounds the code, in bytes, highlighted in one answer; code
// blocks after it are shown escaped but uncoloured. Chroma's lexers are
// regular expressions that backtrack (each match may take up to 250 ms
// before chroma gives up), so highlighting is the costly part of a render:
// 3 to 10 µs a byte of Go, dense code the slowest, so 32 KiB (a long
// program) is at most about 0.3 s.
const maxHighlight = 32 << 10

// maxLangLen bounds the language name taken from a fence's info string.
const maxLangLen = 32

// attrPlain marks a code block past the highlighting budget.
var attrPlain = []byte("moonji-plain")

// The light and dark chroma styles of CSS.
const (
	lightStyle = "github"
	darkStyle  = "github-dark"
)

// formatter writes chroma's tokens as <span class="…">, without its own
// <pre>: the code renderer writes the container. Classes, not inline
// styles, so one stylesheet (CSS) serves light and dark, and the policy need
// not allow style attributes.
var formatter = chromahtml.New(chromahtml.WithClasses(true), chromahtml.PreventSurroundingPre(true))

// codeRenderer renders fenced and indented code blocks in their container:
//
//	<div class="code"><div class="code-head"><span class="code-lang">go</span>
//	<button type="button" class="copy" aria-label="Copy code">Copy</button></div>
//	<pre class="chroma" tabindex="0"><code class="language-go">…</code></pre></div>
//
// The page's script wires the button; nothing here runs anything.
type codeRenderer struct {
	style *chroma.Style
}

func newCodeRenderer() *codeRenderer {
	return &codeRenderer{style: styles.Get(lightStyle)}
}

// RegisterFuncs implements renderer.NodeRenderer.
func (r *codeRenderer) RegisterFuncs(reg renderer.NodeRendererFuncRegisterer) {
	reg.Register(ast.KindFencedCodeBlock, r.render)
	reg.Register(ast.KindCodeBlock, r.render)
}

func (r *codeRenderer) render(w util.BufWriter, source []byte, node ast.Node, entering bool) (ast.WalkStatus, error) {
	if !entering {
		return ast.WalkContinue, nil
	}
	var lang string
	if n, ok := node.(*ast.FencedCodeBlock); ok {
		lang = cleanLang(n.Language(source))
	}
	label := lang
	if label == "" {
		label = "text"
	}
	_, _ = w.WriteString(`<div class="code"><div class="code-head"><span class="code-lang">`)
	_, _ = w.WriteString(label) // cleanLang leaves nothing to escape
	_, _ = w.WriteString(`</span><button type="button" class="copy" aria-label="Copy code">Copy</button></div><pre class="chroma" tabindex="0"><code`)
	if lang != "" {
		_, _ = w.WriteString(` class="language-` + lang + `"`)
	}
	_ = w.WriteByte('>')

	var code strings.Builder
	lines := node.Lines()
	for i := range lines.Len() {
		seg := lines.At(i)
		code.Write(seg.Value(source))
	}
	_, plainOnly := node.AttributeString(string(attrPlain))
	if plainOnly || lang == "" || !r.highlight(w, lang, code.String()) {
		_, _ = w.WriteString(html.EscapeString(code.String()))
	}
	_, _ = w.WriteString("</code></pre></div>\n")
	return ast.WalkSkipChildren, nil
}

// highlight writes code coloured by the lexer for lang, and reports whether
// it did: false, with nothing written, for a language chroma does not know
// or a lexer that failed.
func (r *codeRenderer) highlight(w util.BufWriter, lang, code string) (ok bool) {
	lexer := lexers.Get(lang)
	if lexer == nil {
		return false
	}
	// A lexer is a large third-party state machine fed hostile input; if one
	// panics, the answer is still shown, uncoloured.
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	it, err := chroma.Coalesce(lexer).Tokenise(nil, code)
	if err != nil {
		return false
	}
	var buf bytes.Buffer
	if err := formatter.Format(&buf, r.style, it); err != nil {
		return false
	}
	_, _ = w.Write(buf.Bytes())
	return true
}

// cleanLang is the language of a fence's info string as a class name and
// label: lower case, only letters, digits and +#._- (c++, c#, objective-c,
// .net), at most maxLangLen bytes; "" when nothing is left.
func cleanLang(info []byte) string {
	var b strings.Builder
	for _, c := range bytes.ToLower(info) {
		if b.Len() == maxLangLen {
			break
		}
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("+#._-", c) >= 0 {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// budgetHighlighting marks the code blocks past maxHighlight bytes (in
// document order) to be shown uncoloured.
func budgetHighlighting(doc ast.Node) {
	spent := 0
	_ = ast.Walk(doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		switch n.Kind() {
		case ast.KindFencedCodeBlock, ast.KindCodeBlock:
			size := 0
			lines := n.Lines()
			for i := range lines.Len() {
				seg := lines.At(i)
				size += seg.Len() + seg.Padding
			}
			if spent+size > maxHighlight {
				n.SetAttribute(attrPlain, true)
			} else {
				spent += size
			}
			return ast.WalkSkipChildren, nil
		}
		return ast.WalkContinue, nil
	})
}

// CSS returns the stylesheet for chroma's classes: the github style, and
// github-dark when the reader prefers a dark scheme. The two are in
// exclusive media queries because a style only has rules for the tokens it
// colours: layered, a token dark leaves alone would keep light's colour on
// dark's background. The code container (.code, .code-head, .copy) is the
// page's to style.
func CSS() string { return css() }

var css = sync.OnceValue(func() string {
	f := chromahtml.New(chromahtml.WithClasses(true), chromahtml.WithCSSComments(false))
	var b strings.Builder
	b.WriteString("/* Generated by internal/markdown.CSS: chroma " + lightStyle + " and " + darkStyle + ". */\n")
	b.WriteString("@media not all and (prefers-color-scheme: dark) {\n")
	_ = f.WriteCSS(&b, styles.Get(lightStyle))
	b.WriteString("}\n@media (prefers-color-scheme: dark) {\n")
	_ = f.WriteCSS(&b, styles.Get(darkStyle))
	b.WriteString("}\n")
	return b.String()
})
