package web_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"io"
	"math/rand/v2"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/config"
	"moonji/models"
)

// withVision adds the model "vis", served by the mock engine as m1 and
// marked vision: true.
func withVision(c *config.Config) {
	c.Models = append(c.Models, config.Model{Name: "vis", Backend: "mock", UpstreamModel: "m1", Vision: true})
}

// pngOf encodes a w×h image of noise (it does not compress), different for
// each seed.
func pngOf(t testing.TB, w, h int, seed uint8) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	rnd := rand.New(rand.NewPCG(uint64(seed), 1))
	for x := 0; x < w; x++ {
		for y := 0; y < h; y++ {
			img.Set(x, y, color.RGBA{R: uint8(rnd.Uint32()), G: uint8(rnd.Uint32()), B: seed, A: 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// upload posts a file as the page does (multipart, field "file", the CSRF
// header) and returns the status and body.
func (p *chatter) upload(name string, data []byte) (int, string) {
	p.e.t.Helper()
	// The name as given, unescaped but for quotes: CreateFormFile would do
	// the same, and the server must see a "/" to refuse it.
	return p.uploadAs(`form-data; name="file"; filename="`+strings.ReplaceAll(name, `"`, `\"`)+`"`, data)
}

// uploadAs is upload with the part's Content-Disposition as given.
func (p *chatter) uploadAs(disposition string, data []byte) (int, string) {
	p.e.t.Helper()
	var body bytes.Buffer
	w := multipart.NewWriter(&body)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", disposition)
	h.Set("Content-Type", "application/octet-stream")
	part, err := w.CreatePart(h)
	if err != nil {
		p.e.t.Fatal(err)
	}
	_, _ = part.Write(data)
	_ = w.Close()
	req, _ := http.NewRequest(http.MethodPost, p.e.URL+"/api/v1/attachments", &body)
	req.Header.Set("Content-Type", w.FormDataContentType())
	req.Header.Set("X-CSRF-Token", p.csrf)
	resp, err := p.c.Do(req)
	if err != nil {
		p.e.t.Fatalf("upload: %v", err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, readAll(p.e.t, resp.Body)
}

// attach uploads a file that must be accepted and returns its id.
func (p *chatter) attach(name string, data []byte) string {
	p.e.t.Helper()
	status, body := p.upload(name, data)
	if status != http.StatusCreated {
		p.e.t.Fatalf("upload %s: %d %s", name, status, body)
	}
	return gjson.Get(body, "id").Str
}

func (p *chatter) conversationWith(model string) string {
	p.e.t.Helper()
	status, body := p.do(http.MethodPost, "/api/v1/conversations", `{"model":"`+model+`"}`)
	if status != http.StatusCreated {
		p.e.t.Fatalf("create conversation: %d %s", status, body)
	}
	return gjson.Get(body, "id").Str
}

func (p *chatter) sendWith(conv, content string, ids ...string) (int, string) {
	p.e.t.Helper()
	b, _ := json.Marshal(map[string]any{"content": content, "attachment_ids": ids})
	return p.do(http.MethodPost, "/api/v1/conversations/"+conv+"/messages", string(b))
}

// engineGot is the body the mock engine received whose last message's
// first part (or content) is text.
func engineGot(t *testing.T, e *testEnv, text string) gjson.Result {
	t.Helper()
	for _, r := range e.Mock.Requests() {
		last := gjson.GetBytes(r.Body, "messages.@reverse.0.content")
		if last.Get("0.text").Str == text || last.Str == text {
			return gjson.ParseBytes(r.Body)
		}
	}
	t.Fatalf("the engine never received %q", text)
	return gjson.Result{}
}

func countAttachments(t *testing.T, e *testEnv, where string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := e.DB.Model(&models.Attachment{}).Where(where, args...).Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAttachmentsReachTheEngine: an image and a text file, uploaded and
// sent with a message to a model with vision, reach the engine as content
// parts — the image byte for byte in a data URL, the text file named —
// and again with the next message (they are the conversation's). The file
// is served to its owner alone, with headers that keep a browser from
// running it; an id cannot be sent twice nor by anyone else; deleting the
// conversation deletes its files.
func TestAttachmentsReachTheEngine(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		e := startEnv(t, dbURL, withVision)
		p := e.chatter("painter@example.com")
		img := pngOf(t, 40, 30, 1)
		status, body := p.upload("sunset.png", img)
		if status != http.StatusCreated || gjson.Get(body, "kind").Str != "image" || gjson.Get(body, "name").Str != "sunset.png" ||
			gjson.Get(body, "bytes").Int() != int64(len(img)) || !strings.HasPrefix(gjson.Get(body, "id").Str, "a_") {
			t.Fatalf("upload: %d %s", status, body)
		}
		imgID := gjson.Get(body, "id").Str
		notes := "# Notes\n\nThe sky is ```orange```.\n"
		txtID := p.attach("notes.md", []byte(notes))

		conv := p.conversationWith("vis")
		if status, body := p.sendWith(conv, "What is in this picture?", imgID, txtID); status != http.StatusAccepted {
			t.Fatalf("send: %d %s", status, body)
		}
		if r := p.reply(conv); r.Status != models.MessageDone {
			t.Fatalf("reply: %+v", r)
		}
		got := engineGot(t, e, "What is in this picture?")
		parts := got.Get("messages.@reverse.0.content").Array()
		if len(parts) != 3 || parts[1].Get("type").Str != "image_url" || parts[2].Get("type").Str != "text" {
			t.Fatalf("the engine received %s", got.Get("messages").Raw)
		}
		url := parts[1].Get("image_url.url").Str
		raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(url, "data:image/png;base64,"))
		if !strings.HasPrefix(url, "data:image/png;base64,") || err != nil || !bytes.Equal(raw, img) {
			t.Fatalf("the image reached the engine changed: %.80s… (%v)", url, err)
		}
		if txt := parts[2].Get("text").Str; !strings.Contains(txt, `"notes.md"`) || !strings.Contains(txt, notes) ||
			!strings.HasPrefix(strings.SplitN(txt, "\n", 2)[1], "````\n") {
			t.Fatalf("the text file reached the engine as %q", txt)
		}
		// The next message's request carries the earlier one's files.
		p.send(conv, "And now?")
		p.reply(conv)
		if again := engineGot(t, e, "And now?"); again.Get("messages.0.content.1.image_url.url").Str != url {
			t.Fatalf("the next request lost the image: %.300s", again.Get("messages").Raw)
		}

		// Served to the owner, as what it is, sandboxed, kept by the browser.
		req, _ := http.NewRequest(http.MethodGet, e.URL+"/api/v1/attachments/"+imgID, nil)
		resp, err := p.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		served := readAll(t, resp.Body)
		resp.Body.Close()
		h := resp.Header
		if resp.StatusCode != http.StatusOK || served != string(img) || h.Get("Content-Type") != "image/png" ||
			h.Get("X-Content-Type-Options") != "nosniff" || !strings.HasPrefix(h.Get("Content-Security-Policy"), "sandbox") ||
			!strings.HasPrefix(h.Get("Content-Disposition"), `inline; filename="sunset.png"`) ||
			!strings.HasPrefix(h.Get("Cache-Control"), "private") {
			t.Fatalf("serve: %d %v (%d bytes)", resp.StatusCode, h, len(served))
		}
		if pg := p.page("/api/v1/attachments/" + txtID); pg.status != http.StatusOK || pg.body != notes ||
			!strings.HasPrefix(pg.header.Get("Content-Type"), "text/plain") || !strings.HasPrefix(pg.header.Get("Content-Disposition"), "attachment;") {
			t.Fatalf("serve text: %d %v", pg.status, pg.header)
		}

		// Nobody else's: to read, or to send.
		other := e.chatter("thief@example.com")
		if pg := other.page("/api/v1/attachments/" + imgID); pg.status != http.StatusNotFound {
			t.Fatalf("another person read the image: %d", pg.status)
		}
		theirs := other.conversationWith("vis")
		if status, body := other.sendWith(theirs, "Mine now", imgID); status != http.StatusBadRequest ||
			gjson.Get(body, "error.param").Str != "attachment_ids[0]" {
			t.Fatalf("another person sent the image: %d %s", status, body)
		}
		// Sent once only, even by its owner.
		if status, body := p.sendWith(conv, "Again", txtID); status != http.StatusBadRequest ||
			gjson.Get(body, "error.param").Str != "attachment_ids[0]" || !strings.Contains(gjson.Get(body, "error.message").Str, "sent already") {
			t.Fatalf("an attachment sent twice: %d %s", status, body)
		}

		// Deleted with the conversation.
		if status, _ := p.do(http.MethodDelete, "/api/v1/conversations/"+conv, ""); status != http.StatusNoContent {
			t.Fatalf("delete: %d", status)
		}
		if pg := p.page("/api/v1/attachments/" + imgID); pg.status != http.StatusNotFound {
			t.Fatalf("the image outlived its conversation: %d", pg.status)
		}
		if n := countAttachments(t, e, "conversation_id = ?", conv); n != 0 {
			t.Fatalf("%d attachments outlived their conversation", n)
		}
	})
}

// TestAttachmentRefusals: every bad file is refused with why, and nothing
// stored: too large (by its announced length, and read), a type not
// allowed (a lying extension), a malformed image, a name with a path or a
// control character, more files than a message may carry (configured),
// images to a model that cannot see them — the attachment then stays the
// person's to send elsewhere.
func TestAttachmentRefusals(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		e := startEnv(t, dbURL, withVision, func(c *config.Config) {
			c.Attachments = config.Attachments{MaxBytes: 4096, MaxPerMessage: 2}
		})
		p := e.chatter("careless@example.com")
		img := pngOf(t, 8, 8, 2)
		big := pngOf(t, 200, 200, 3)
		if len(big) <= 4096 {
			t.Fatalf("the large image is only %d bytes", len(big))
		}
		truncated := img[:len(img)-10]
		for _, c := range []struct {
			name   string
			data   []byte
			status int
			code   string
		}{
			{"big.png", big, http.StatusRequestEntityTooLarge, "file_too_large"},
			{"program.png", append([]byte("\x7fELF\x02\x01\x01"), make([]byte, 64)...), http.StatusUnsupportedMediaType, "unsupported_file_type"},
			{"notes.txt", []byte("%PDF-1.4\n\xe2\xe3\xcf\xd3\n"), http.StatusBadRequest, "invalid_text_file"},
			{"cut.png", truncated, http.StatusBadRequest, "malformed_image"},
			{"a/b.png", img, http.StatusBadRequest, "invalid_file_name"},
			{`a\b.png`, img, http.StatusBadRequest, "invalid_file_name"},
			{"..", img, http.StatusBadRequest, "invalid_file_name"},
			{"", img, http.StatusBadRequest, "invalid_file_name"},
			{"long.txt", bytes.Repeat([]byte("x"), 4097), http.StatusRequestEntityTooLarge, "file_too_large"},
		} {
			status, body := p.upload(c.name, c.data)
			if status != c.status || gjson.Get(body, "error.code").Str != c.code || gjson.Get(body, "error.message").Str == "" {
				t.Errorf("%q: %d %s, want %d %s", c.name, status, body, c.status, c.code)
			}
		}
		// Control characters arrive percent-encoded (RFC 2231), as header
		// lines cannot carry them.
		for _, enc := range []string{"bell%07.png", "nul%00.png", "line%0Abreak.png", "gpj%E2%80%AE.exe"} {
			status, body := p.uploadAs(`form-data; name="file"; filename*=UTF-8''`+enc, img)
			if status != http.StatusBadRequest || gjson.Get(body, "error.code").Str != "invalid_file_name" {
				t.Errorf("%s: %d %s", enc, status, body)
			}
		}
		if n := countAttachments(t, e, "1 = 1"); n != 0 {
			t.Fatalf("refused files stored: %d", n)
		}
		// Refused from its announced length, before its body is read.
		req, _ := http.NewRequest(http.MethodPost, e.URL+"/api/v1/attachments", io.LimitReader(zeros{}, 1<<20))
		req.ContentLength = 1 << 20
		req.Header.Set("Content-Type", "multipart/form-data; boundary=x")
		req.Header.Set("X-CSRF-Token", p.csrf)
		if resp, err := p.c.Do(req); err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("an announced 1 MB upload: %v %v", resp, err)
		} else {
			resp.Body.Close()
		}
		// No session, or no CSRF header: refused.
		anon := &http.Client{Timeout: 10 * time.Second}
		req, _ = http.NewRequest(http.MethodPost, e.URL+"/api/v1/attachments", strings.NewReader("--x--"))
		req.Header.Set("Content-Type", "multipart/form-data; boundary=x")
		if resp, err := anon.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("an upload without a session: %v %v", resp, err)
		}
		noCSRF := *p
		noCSRF.csrf = "wrong"
		if status, _ := noCSRF.upload("ok.png", img); status != http.StatusUnauthorized {
			t.Fatalf("an upload without the CSRF header: %d", status)
		}

		// More than max_per_message.
		a, b, c := p.attach("1.png", img), p.attach("2.png", pngOf(t, 8, 8, 4)), p.attach("3.txt", []byte("three"))
		conv := p.conversationWith("vis")
		if status, body := p.sendWith(conv, "Three", a, b, c); status != http.StatusBadRequest ||
			gjson.Get(body, "error.code").Str != "too_many_attachments" || gjson.Get(body, "error.param").Str != "attachment_ids" {
			t.Fatalf("three attachments: %d %s", status, body)
		}
		// An image to a model without vision: refused, nothing stored, the
		// image still the person's to send.
		plain := p.conversationWith("m1")
		status, body := p.sendWith(plain, "Look", c, a)
		if status != http.StatusBadRequest || gjson.Get(body, "error.code").Str != "model_cannot_see_images" ||
			gjson.Get(body, "error.param").Str != "attachment_ids[1]" || !strings.Contains(gjson.Get(body, "error.message").Str, "cannot see images") {
			t.Fatalf("an image to a model without vision: %d %s", status, body)
		}
		if msgs := p.conversation(plain).Messages; len(msgs) != 0 {
			t.Fatalf("a refused send stored %d messages", len(msgs))
		}
		// Text files go to any model.
		if status, body := p.sendWith(plain, "Read this", c); status != http.StatusAccepted {
			t.Fatalf("a text file to a model without vision: %d %s", status, body)
		}
		p.reply(plain)
		if got := engineGot(t, e, "Read this"); !strings.Contains(got.Get("messages.0.content.1.text").Str, "three") {
			t.Fatalf("the text file did not reach the engine: %s", got.Get("messages").Raw)
		}
		if status, body := p.sendWith(conv, "Two", a, b); status != http.StatusAccepted {
			t.Fatalf("two images to a model with vision: %d %s", status, body)
		}
		p.reply(conv)
		// Bad ids in the body.
		for _, bad := range []string{`{"content":"x","attachment_ids":"a_1"}`, `{"content":"x","attachment_ids":[7]}`,
			`{"content":"x","attachment_ids":["` + strings.Repeat("a", 65) + `"]}`, `{"content":"x","attachment_ids":["a_nope"]}`} {
			if status, body := p.do(http.MethodPost, "/api/v1/conversations/"+conv+"/messages", bad); status != http.StatusBadRequest ||
				!strings.HasPrefix(gjson.Get(body, "error.param").Str, "attachment_ids") {
				t.Errorf("%s: %d %s", bad, status, body)
			}
		}
	})
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestUnsentAttachmentsAreBounded: a person holds at most 20 files
// uploaded and not sent; an hour-old one is swept by their next upload.
func TestUnsentAttachmentsAreBounded(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/u.db")
	p := e.chatter("hoarder@example.com")
	for i := range 20 {
		p.attach("n.txt", []byte{'a' + byte(i)})
	}
	if status, body := p.upload("n.txt", []byte("one more")); status != http.StatusTooManyRequests ||
		gjson.Get(body, "error.code").Str != "too_many_uploads" {
		t.Fatalf("a 21st unsent file: %d %s", status, body)
	}
	if err := e.DB.Model(&models.Attachment{}).Where("1 = 1").Update("created_at", time.Now().Add(-2*time.Hour)).Error; err != nil {
		t.Fatal(err)
	}
	p.attach("n.txt", []byte("fresh"))
	if n := countAttachments(t, e, "1 = 1"); n != 1 {
		t.Fatalf("%d attachments after the sweep, want the fresh one", n)
	}
}

// TestV1RefusesImagesWithoutVision: /v1/chat/completions with an image
// part to a model without vision is 400 in OpenAI's shape naming the part
// (an escaped or repeated "type" is an image too); to a model with vision
// it passes.
func TestV1RefusesImagesWithoutVision(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/v.db", withVision)
	img := "data:image/png;base64," + base64.StdEncoding.EncodeToString(pngOf(t, 2, 2, 5))
	for _, c := range []struct{ part, param string }{
		{`{"type":"image_url","image_url":{"url":"` + img + `"}}`, "messages[1].content[1]"},
		{`{"type":"image\u005furl","image_url":{"url":"` + img + `"}}`, "messages[1].content[1]"},
		{`{"type":"text","text":"x","type":"image_url"}`, "messages[1].content[1]"},
	} {
		body := `{"model":"m1","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"What is it?"},` + c.part + `]}]}`
		resp := e.post(body)
		out := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || gjson.Get(out, "error.param").Str != c.param ||
			gjson.Get(out, "error.code").Str != "model_cannot_see_images" || gjson.Get(out, "error.type").Str != "invalid_request_error" {
			t.Errorf("%s: %d %s", c.part, resp.StatusCode, out)
		}
		ok := strings.Replace(body, `"model":"m1"`, `"model":"vis"`, 1)
		if !strings.Contains(c.part, `"text":"x"`) {
			resp = e.post(ok)
			out = readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("to the vision model: %d %s", resp.StatusCode, out)
			}
		}
	}
	// Text parts alone pass.
	resp := e.post(`{"model":"m1","messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}]}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("text parts: %d", resp.StatusCode)
	}
}

// TestAttachmentsOnThePage: the composer sends attachment_ids with its
// form; the person's message shows the image as a thumbnail linking to the
// original and the text file as a chip.
func TestAttachmentsOnThePage(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/p.db", withVision)
	p := e.chatter("page@example.com")
	img, txt := p.attach("cat.png", pngOf(t, 16, 16, 6)), p.attach("main.go", []byte("package main\n"))
	pg := p.form("/chat", url.Values{"conversation": {""}, "model": {"vis"}, "content": {"Look"}, "attachment_ids": {img, txt}}, true)
	if pg.status != http.StatusOK || !strings.Contains(pg.body, `src="/api/v1/attachments/`+img+`"`) ||
		!strings.Contains(pg.body, `href="/api/v1/attachments/`+txt+`"`) || !strings.Contains(pg.body, "main.go") {
		t.Fatalf("send: %d %s", pg.status, pg.body)
	}
	conv := strings.TrimPrefix(pg.header.Get("HX-Push-Url"), "/c/")
	p.reply(conv)
	if pg := p.page("/c/" + conv); !strings.Contains(pg.body, `src="/api/v1/attachments/`+img+`"`) ||
		!strings.Contains(pg.body, `alt="cat.png"`) {
		t.Fatalf("page: %d %s", pg.status, pg.body)
	}
	// A refusal shows above the composer.
	again := p.form("/chat", url.Values{"conversation": {conv}, "model": {"m1"}, "content": {"Again"}, "attachment_ids": {img}}, true)
	if again.status != http.StatusOK || again.header.Get("HX-Retarget") != "#composer-error" || !strings.Contains(again.body, "sent already") {
		t.Fatalf("a used attachment: %d %v %s", again.status, again.header, again.body)
	}
}

// An edit of a message sent with an image keeps the image in the new
// version (it reaches the engine again, byte for byte) unless the edit
// names files of its own; the first version keeps its own.
func TestEditKeepsTheAttachments(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/edit-files.db", withVision)
	p := e.chatter("editor@example.com")
	img, other := pngOf(t, 20, 20, 3), pngOf(t, 24, 24, 4)
	conv := p.conversationWith("vis")
	if status, body := p.sendWith(conv, "Describe it", p.attach("a.png", img)); status != http.StatusAccepted {
		t.Fatalf("send: %d %s", status, body)
	}
	p.reply(conv)
	first := p.conversation(conv).Messages[0].ID
	imageOf := func(text string) []byte {
		t.Helper()
		url := engineGot(t, e, text).Get("messages.@reverse.0.content.1.image_url.url").Str
		raw, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(url, "data:image/png;base64,"))
		return raw
	}
	if status, body := p.do(http.MethodPost, "/api/v1/messages/"+first+"/edit", `{"content":"Describe it, briefly"}`); status != http.StatusAccepted {
		t.Fatalf("edit: %d %s", status, body)
	}
	p.reply(conv)
	if !bytes.Equal(imageOf("Describe it, briefly"), img) {
		t.Fatal("the edited version lost its image")
	}
	b, _ := json.Marshal(map[string]any{"content": "This one instead", "attachment_ids": []string{p.attach("b.png", other)}})
	if status, body := p.do(http.MethodPost, "/api/v1/messages/"+first+"/edit", string(b)); status != http.StatusAccepted {
		t.Fatalf("edit with a file: %d %s", status, body)
	}
	p.reply(conv)
	if !bytes.Equal(imageOf("This one instead"), other) {
		t.Fatal("an edit with its own file did not send it")
	}
	if n := countAttachments(t, e, "message_id = ?", first); n != 1 {
		t.Fatalf("the first version has %d files, want its own one", n)
	}
}
