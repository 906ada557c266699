package markdown

import (
	"html"
	"regexp"
	"strings"
	"testing"
)

// tagRE finds the tags of sanitized output: text there has every "<"
// escaped, so a "<" always starts a tag.
var tagRE = regexp.MustCompile(`<[^>]*>`)

var (
	handlerRE = regexp.MustCompile(`(?i)\bon\w+\s*=`)
	badURLRE  = regexp.MustCompile(`(?i)(javascript|vbscript|data)\s*:`)
)

// assertInert fails when out could run script. Tags are checked after
// decoding entities (href="&#106;avascript:" is javascript:); the text is
// checked too unless the payload is shown, escaped, as text: in code, or
// where Markdown does not read it as a link.
func assertInert(t *testing.T, out string, shown bool) {
	t.Helper()
	if strings.Contains(strings.ToLower(out), "<script") {
		t.Errorf("output has <script:\n%s", out)
	}
	for _, tag := range tagRE.FindAllString(out, -1) {
		tag = html.UnescapeString(tag)
		if handlerRE.MatchString(tag) || badURLRE.MatchString(tag) {
			t.Errorf("script-capable tag %q in:\n%s", tag, out)
		}
		name := strings.ToLower(strings.Fields(strings.Trim(tag, "</>"))[0])
		switch name {
		case "iframe", "svg", "math", "object", "embed", "style", "form", "base", "meta", "link":
			t.Errorf("tag %q in:\n%s", tag, out)
		}
	}
	if !shown {
		if handlerRE.MatchString(out) || regexp.MustCompile(`(?i)javascript:`).MatchString(out) {
			t.Errorf("handler or javascript: in:\n%s", out)
		}
	}
}

func TestXSS(t *testing.T) {
	cases := []struct {
		name, src string
		shown     bool
	}{
		{"script tag", "<script>alert(1)</script>", false},
		{"script inline", "hi <script>alert(1)</script> there", false},
		{"script split", "<scr<script>ipt>alert(1)</script>", false},
		{"img onerror", "<img src=x onerror=alert(1)>", true},
		{"img onerror inline", "text <img src=x onerror=alert(1)> text", true},
		{"link javascript", "[x](javascript:alert(1))", false},
		{"link mixed case", "[x](JaVaScRiPt:alert(1))", false},
		{"link entity", "[x](&#106;avascript:alert(1))", false},
		{"link percent", "[x](javascript%3Aalert(1))", false},
		{"link tab", "[x](java\tscript:alert(1))", false},
		{"link vbscript", "[x](vbscript:msgbox(1))", false},
		{"reference link", "[x][1]\n\n[1]: javascript:alert(1)", false},
		{"image data", "![x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)", false},
		{"image javascript", "![x](javascript:alert(1))", false},
		{"raw a entity", `<a href="&#106;avascript:alert(1)">x</a>`, false},
		{"raw a javascript", `<a href="javascript:alert(1)">x</a>`, true},
		{"html in fence", "```html\n<script>alert(1)</script>\n<img src=x onerror=alert(1)>\n```", true},
		{"html in unknown fence", "```nosuchlang\n<script>alert(1)</script>\n```", true},
		{"html in indented code", "    <script>alert(1)</script>", true},
		{"html in inline code", "`<script>alert(1)</script>`", true},
		{"fence info quotes", "```go\" onclick=\"alert(1)\n<b>x</b>\n```", true},
		{"autolink attribute", `<http://a.com/" onmouseover="alert(1)>`, true},
		{"autolink javascript", "<javascript:alert(1)>", true},
		{"bare autolink quotes", `www.a.com/"onmouseover="alert(1)`, true},
		{"svg onload", "<svg onload=alert(1)>", true},
		{"svg in paragraph", "a <svg><script>alert(1)</script></svg> b", false},
		{"iframe", `<iframe src="javascript:alert(1)"></iframe>`, true},
		{"iframe srcdoc", `<iframe srcdoc="<script>alert(1)</script>"></iframe>`, false},
		{"link title quotes", `[x](https://a.com "t\" onmouseover=\"alert(1)")`, false},
		{"link destination quotes", `[x](<https://a.com/" onmouseover="alert(1)>)`, false},
		{"image alt quotes", `![x" onerror="alert(1)](https://a.com/a.png)`, true},
		{"table cell html", "| a |\n|---|\n| <img src=x onerror=alert(1)> |", true},
		{"html block", "<div onclick=\"alert(1)\">\n\n*x*\n\n</div>", true},
		{"style tag", "<style>body{background:url(javascript:alert(1))}</style>", true},
		{"form", `<form action="javascript:alert(1)"><button>x</button></form>`, true},
		{"math", `<math><mi xlink:href="javascript:alert(1)">x</mi></math>`, true},
		{"comment", "<!-- --><script>alert(1)</script> -->", false},
		{"cdata", "<![CDATA[<script>alert(1)</script>]]>", false},
		{"meta refresh", `<meta http-equiv="refresh" content="0;url=javascript:alert(1)">`, true},
		{"nul in tag", "<scr\x00ipt>alert(1)</script>", false},
	}
	renderers := map[string]*Renderer{"default": defaultRenderer, "images": New(Options{Images: true})}
	for rname, r := range renderers {
		for _, c := range cases {
			t.Run(rname+"/"+c.name, func(t *testing.T) {
				assertInert(t, r.Render(c.src), c.shown)
			})
		}
	}
}

func TestLinks(t *testing.T) {
	out := Render("see [docs](https://example.com/a?b=1) and https://example.org and [rel](/admin)")
	for _, want := range []string{
		`href="https://example.com/a?b=1"`, `target="_blank"`, `nofollow`, `noopener`, `noreferrer`,
		`href="https://example.org"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in:\n%s", want, out)
		}
	}
	if strings.Contains(out, `/admin`) {
		t.Errorf("relative link kept:\n%s", out)
	}
}

func TestImages(t *testing.T) {
	src := "![chart](https://example.com/c.png)"
	if out := Render(src); strings.Contains(out, "<img") || !strings.Contains(out, `<a href="https://example.com/c.png"`) {
		t.Errorf("default renderer: want the image as a link:\n%s", out)
	}
	if out := New(Options{Images: true}).Render(src); !strings.Contains(out, `<img src="https://example.com/c.png" alt="chart">`) {
		t.Errorf("Images: want an <img>:\n%s", out)
	}
}

func TestCodeBlock(t *testing.T) {
	out := Render("Here:\n\n```go\npackage main\n\nfunc main() {}\n```\n")
	for _, want := range []string{
		`<div class="code"><div class="code-head"><span class="code-lang">go</span>`,
		`<button type="button" class="copy" aria-label="Copy code">Copy</button>`,
		`<pre class="chroma" tabindex="0"><code class="language-go">`,
		`<span class="kn">package</span>`, `<span class="kd">func</span>`, `<span class="nf">main</span>`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "style=") {
		t.Errorf("inline style in:\n%s", out)
	}
}

func TestCodeBlockUnknownLanguage(t *testing.T) {
	out := Render("```\n<b>x</b>\n```")
	if !strings.Contains(out, `<span class="code-lang">text</span>`) || !strings.Contains(out, "&lt;b&gt;x&lt;/b&gt;") {
		t.Errorf("plain code block:\n%s", out)
	}
}

func TestUnfinishedFence(t *testing.T) {
	out := Render("Start:\n\n```python\ndef f():\n    return 1")
	if !strings.Contains(out, `<code class="language-python">`) || !strings.Contains(out, `<span class="k">return</span>`) ||
		!strings.HasSuffix(strings.TrimSpace(out), "</code></pre></div>") {
		t.Errorf("unfinished fence:\n%s", out)
	}
}

func TestTable(t *testing.T) {
	out := Render("| name | n |\n|:-----|--:|\n| a | 1 |\n| ~~b~~ | 2 |\n")
	for _, want := range []string{"<table>", `<th align="left">name</th>`, `<td align="right">1</td>`, "<del>b</del>"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in:\n%s", want, out)
		}
	}
}

func TestTaskList(t *testing.T) {
	out := Render("- [x] done\n- [ ] todo\n")
	if !strings.Contains(out, `<input checked="" disabled="" type="checkbox"> done`) ||
		!strings.Contains(out, `<input disabled="" type="checkbox"> todo`) {
		t.Errorf("task list:\n%s", out)
	}
}

func TestRawHTMLNotRendered(t *testing.T) {
	out := Render("a <b>bold</b> <kbd>k</kbd>\n\n<div>block</div>")
	if strings.Contains(out, "<b>") || strings.Contains(out, "<kbd>") || strings.Contains(out, "<div>") {
		t.Errorf("raw HTML rendered:\n%s", out)
	}
	// It is shown as the text it is, not dropped.
	for _, want := range []string{"&lt;b&gt;bold&lt;/b&gt;", "&lt;kbd&gt;k&lt;/kbd&gt;", "&lt;div&gt;block&lt;/div&gt;"} {
		if !strings.Contains(out, want) {
			t.Errorf("raw HTML %q lost:\n%s", want, out)
		}
	}
}

func TestMaxInput(t *testing.T) {
	at := strings.Repeat("# a <b>\n", MaxInput/8)
	if out := Render(at); !strings.Contains(out, "<h1>") {
		t.Errorf("input of MaxInput bytes not rendered as Markdown")
	}
	over := at + "x"
	out := Render(over)
	if !strings.HasPrefix(out, `<pre class="plain" tabindex="0">`) || strings.Contains(out, "<h1>") || strings.Contains(out, "<b>") ||
		!strings.Contains(out, "# a &lt;b&gt;") {
		t.Errorf("input over MaxInput not plain text: %.200s", out)
	}
}

// deepCases are shapes that make goldmark slow (it is quadratic in
// nesting depth, see nesting.go): the first are refused and shown as plain
// text; the last, near the bounds, are the slowest still rendered as
// Markdown (BenchmarkRenderNearBounds measures them).
func deepCases() (refused, accepted map[string]string) {
	stair := func(indent int, item string) string {
		var b strings.Builder
		for i := 0; b.Len() < MaxInput-1000; i++ {
			b.WriteString(strings.Repeat(" ", indent*i) + item)
		}
		return b.String()
	}
	refused = map[string]string{
		"quotes":           strings.Repeat(">", 100_000),
		"quotes spaced":    strings.Repeat("> ", 100_000) + "x",
		"bullets":          strings.Repeat("- ", 100_000) + "x",
		"mixed bullets":    strings.Repeat("- * + ", 30_000) + "x",
		"ordered":          strings.Repeat("1. ", 100_000) + "x",
		"quotes and lists": strings.Repeat("> 1) - ", 30_000) + "x",
		"list then blanks": strings.Repeat("- ", 32) + "x" + strings.Repeat("\n", 1_000_000),
		"quote then lazy":  strings.Repeat("> ", 64) + "x\n" + strings.Repeat("y\n", 500_000),
		"indented stair":   stair(2, "- x\n"),
		"stair of four":    stair(8, "- - - - x\n"),
		"lines of 64":      strings.Repeat(strings.Repeat("- ", 64)+"x\n", MaxInput/130),
	}
	accepted = map[string]string{
		"thematic breaks":    strings.Repeat(strings.Repeat("- ", 200)+"\n", MaxInput/402),
		"lines of 20":        strings.Repeat(strings.Repeat("- ", 20)+"x\n", maxMarkers/20),
		"short list, blanks": "- - x" + strings.Repeat("\n", maxNestingCost/3-1),
		"quote of 20, lazy":  strings.Repeat("> ", 20) + "x\n" + strings.Repeat("y\n", 30_000),
	}
	return refused, accepted
}

// TestDeepNesting: the shapes that would take goldmark seconds to minutes
// are shown as plain text; those near the bounds still render. (How long
// they take is a benchmark's business, not a test's: under the race
// detector everything is several times slower.)
func TestDeepNesting(t *testing.T) {
	refused, accepted := deepCases()
	for name, src := range refused {
		t.Run(name, func(t *testing.T) {
			if out := Render(src); !strings.HasPrefix(out, `<pre class="plain" tabindex="0">`) {
				t.Errorf("rendered as Markdown: %.100s", out)
			}
		})
	}
	for name, src := range accepted {
		t.Run(name, func(t *testing.T) {
			if out := Render(src); out == "" || strings.HasPrefix(out, `<pre class="plain" tabindex="0">`) {
				t.Errorf("not rendered as Markdown: %.100s", out)
			}
		})
	}
}

// BenchmarkRenderNearBounds renders the slowest shapes still accepted
// (about 0.2–0.3 s each on this machine) and the refused ones (ms).
//
//	go test -run '^$' -bench RenderNearBounds ./internal/markdown/
func BenchmarkRenderNearBounds(b *testing.B) {
	refused, accepted := deepCases()
	for _, set := range []map[string]string{accepted, refused} {
		for name, src := range set {
			b.Run(name, func(b *testing.B) {
				for b.Loop() {
					Render(src)
				}
			})
		}
	}
}

func TestNestingKeepsRealAnswers(t *testing.T) {
	src := "1. one\n   - two\n     > three\n     > - four\n\n```json\n" + strings.Repeat(" ", 40) + "{\"deep\": true}\n```\n\n" + strings.Repeat("-", 60) + "\n\n* * * * * * * * * * * * * * * * * * * * * * * * * * * * * * * * * * * * * *\n"
	if cost := nestingCost(src); cost > maxNestingCost {
		t.Fatalf("nestingCost = %d", cost)
	}
	out := Render(src)
	if !strings.Contains(out, "<blockquote>") || !strings.Contains(out, "<hr>") {
		t.Errorf("real answer:\n%s", out)
	}
}

func TestInvalidUTF8(t *testing.T) {
	out := Render("a \xff\xfe b\n\n```go\n\"\xc3\"\n```")
	if !strings.Contains(out, "\uFFFD") {
		t.Errorf("invalid UTF-8 not replaced:\n%s", out)
	}
}

func TestCSS(t *testing.T) {
	css := CSS()
	for _, want := range []string{"@media (prefers-color-scheme: dark)", "@media not all and (prefers-color-scheme: dark)", ".chroma .kd", ".chroma {"} {
		if !strings.Contains(css, want) {
			t.Errorf("no %q in CSS", want)
		}
	}
	if strings.Count(css, ".chroma .kd") != 2 {
		t.Errorf("want .chroma .kd in both schemes")
	}
}

func TestConcurrent(t *testing.T) {
	src := answer()
	want := Render(src)
	done := make(chan string)
	for range 8 {
		go func() { done <- Render(src) }()
	}
	for range 8 {
		if got := <-done; got != want {
			t.Error("concurrent render differs")
		}
	}
}

// answer is a realistic 4 KB answer: prose, a list, a table, two code blocks.
func answer() string {
	var b strings.Builder
	b.WriteString("## Reading a file line by line\n\nIn **Go**, the idiomatic way is `bufio.Scanner`; it handles `\\r\\n` and keeps memory flat. See the [docs](https://pkg.go.dev/bufio#Scanner).\n\n")
	b.WriteString("1. Open the file with `os.Open`.\n2. Wrap it in a scanner.\n3. Check `scanner.Err()` at the end — a *long line* stops the scan.\n\n")
	b.WriteString("```go\npackage main\n\nimport (\n\t\"bufio\"\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n\tf, err := os.Open(\"input.txt\")\n\tif err != nil {\n\t\tfmt.Fprintln(os.Stderr, err)\n\t\tos.Exit(1)\n\t}\n\tdefer f.Close()\n\n\tscanner := bufio.NewScanner(f)\n\tscanner.Buffer(make([]byte, 0, 64*1024), 1024*1024)\n\tfor n := 1; scanner.Scan(); n++ {\n\t\tfmt.Printf(\"%4d %s\\n\", n, scanner.Text())\n\t}\n\tif err := scanner.Err(); err != nil {\n\t\tfmt.Fprintln(os.Stderr, \"read:\", err)\n\t}\n}\n```\n\n")
	b.WriteString("| approach | memory | long lines |\n|:--|:--|:--|\n| `bufio.Scanner` | flat | needs `Buffer` |\n| `bufio.Reader.ReadString` | per line | fine |\n| `os.ReadFile` + `strings.Split` | whole file | fine |\n\n")
	b.WriteString("The same in Python, for comparison:\n\n```python\nimport sys\n\ndef main(path: str) -> int:\n    try:\n        with open(path, encoding=\"utf-8\") as f:\n            for n, line in enumerate(f, start=1):\n                print(f\"{n:4d} {line.rstrip()}\")\n    except OSError as e:\n        print(e, file=sys.stderr)\n        return 1\n    return 0\n\nif __name__ == \"__main__\":\n    sys.exit(main(sys.argv[1]))\n```\n\n")
	b.WriteString("> **Note:** `Scanner` splits on `\\n` by default; use `scanner.Split(bufio.ScanWords)` for words.\n\n")
	for b.Len() < 4000 {
		b.WriteString("Another paragraph with _emphasis_, ~~a mistake~~, and a link to https://go.dev/doc/effective_go for more reading on the subject.\n\n")
	}
	return b.String()
}

func BenchmarkRender(b *testing.B) {
	src := answer()
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for b.Loop() {
		Render(src)
	}
}

func TestHighlightBudget(t *testing.T) {
	first := strings.Repeat("x := 1\n", maxHighlight/7) // the second block does not fit
	out := Render("```go\n" + first + "```\n\n```go\nfunc f() {}\n```\n")
	if !strings.Contains(out, `<span class="nx">x</span>`) {
		t.Error("first block, within the budget, not highlighted")
	}
	if !strings.Contains(out, `<code class="language-go">func f() {}`) {
		t.Errorf("second block, past the budget, highlighted: %s", out[len(out)-300:])
	}
}
