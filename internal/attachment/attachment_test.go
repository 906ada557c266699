package attachment

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"strings"
	"testing"
)

func encodePNG(t testing.TB, w, h int) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for x := range w {
		img.Set(x, 0, color.RGBA{R: uint8(x), A: 255})
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeJPEG(t testing.TB, w, h int) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := jpeg.Encode(&b, image.NewGray(image.Rect(0, 0, w, h)), nil); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeGIF(t testing.TB, w, h int) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := gif.Encode(&b, image.NewPaletted(image.Rect(0, 0, w, h), color.Palette{color.Black, color.White}), nil); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// webpLossless is a 1×1 lossless WebP (VP8L), as cwebp writes it.
var webpLossless, _ = base64.StdEncoding.DecodeString("UklGRhoAAABXRUJQVlA4TA0AAAAvAAAAEAcQERGIiP4HAA==")

// pngWithHeader replaces the IHDR of a valid PNG by one declaring w×h,
// with a correct CRC: a file whose header claims what the test wants.
func pngWithHeader(t testing.TB, w, h uint32) []byte {
	t.Helper()
	b := bytes.Clone(encodePNG(t, 2, 2))
	ihdr := b[8+8 : 8+8+13]
	binary.BigEndian.PutUint32(ihdr[0:4], w)
	binary.BigEndian.PutUint32(ihdr[4:8], h)
	binary.BigEndian.PutUint32(b[8+8+13:], crc32.ChecksumIEEE(b[8+4:8+8+13]))
	return b
}

func TestCheckAcceptsWholeImagesByTheirBytes(t *testing.T) {
	for _, c := range []struct {
		name, mime string
		data       []byte
		w, h       int
	}{
		{"a.png", MIMEPNG, encodePNG(t, 30, 20), 30, 20},
		{"b.jpg", MIMEJPEG, encodeJPEG(t, 16, 9), 16, 9},
		{"c.gif", MIMEGIF, encodeGIF(t, 5, 4), 5, 4},
		{"d.webp", MIMEWebP, webpLossless, 1, 1},
		// The name says text; the bytes say PNG: an image.
		{"lying.txt", MIMEPNG, encodePNG(t, 3, 3), 3, 3},
	} {
		f, err := Check(c.name, c.data, Limits{})
		if err != nil || f.Kind != KindImage || f.MIME != c.mime || f.Width != c.w || f.Height != c.h {
			t.Errorf("%s: %+v %v", c.name, f, err)
		}
	}
}

func TestCheckRefusesBadImages(t *testing.T) {
	good := encodePNG(t, 8, 8)
	crcBroken := bytes.Clone(good)
	crcBroken[len(crcBroken)-20] ^= 0xFF // inside IDAT
	jpg := encodeJPEG(t, 8, 8)
	gifCut := encodeGIF(t, 4, 4)
	webpCut := bytes.Clone(webpLossless)
	binary.LittleEndian.PutUint32(webpCut[4:8], 999)
	for _, c := range []struct {
		what string
		data []byte
		code string
	}{
		{"truncated PNG", good[:len(good)-12], CodeMalformed},
		{"PNG header only", good[:33], CodeMalformed},
		{"PNG signature only", good[:8], CodeMalformed},
		{"PNG with a broken CRC", crcBroken, CodeMalformed},
		{"PNG with bytes after IEND", append(bytes.Clone(good), 0), CodeMalformed},
		{"zero-width PNG", pngWithHeader(t, 0, 8), CodeMalformed},
		{"bomb PNG (a million pixels a side)", pngWithHeader(t, 1_000_000, 1_000_000), CodeDimensions},
		{"bomb PNG (60 megapixels)", pngWithHeader(t, 10_000, 6_000), CodeDimensions},
		{"truncated JPEG", jpg[:len(jpg)/2], CodeMalformed},
		{"JPEG without its end", jpg[:len(jpg)-2], CodeMalformed},
		{"GIF without its trailer", gifCut[:len(gifCut)-1], CodeMalformed},
		{"WebP whose RIFF size lies", webpCut, CodeMalformed},
		{"WebP header only", webpLossless[:16], CodeMalformed},
	} {
		_, err := Check("x.png", c.data, Limits{})
		if e, ok := err.(*Error); !ok || e.Code != c.code || e.Message == "" {
			t.Errorf("%s: %v, want %s", c.what, err, c.code)
		}
	}
}

func TestCheckRefusesBadFiles(t *testing.T) {
	elf := append([]byte("\x7fELF\x02\x01\x01\x00"), make([]byte, 100)...)
	for _, c := range []struct {
		what, name string
		data       []byte
		lim        Limits
		code       string
	}{
		{"an executable named .png", "cat.png", elf, Limits{}, CodeType},
		{"an executable named .txt", "notes.txt", elf, Limits{}, CodeBadText},
		{"text named .exe", "setup.exe", []byte("hello"), Limits{}, CodeType},
		{"text without an extension", "notes", []byte("hello"), Limits{}, CodeType},
		{"invalid UTF-8", "notes.txt", []byte("caf\xe9"), Limits{}, CodeBadText},
		{"a NUL", "notes.md", []byte("a\x00b"), Limits{}, CodeBadText},
		{"empty", "notes.md", nil, Limits{}, CodeEmpty},
		{"text over 512 KB", "big.txt", bytes.Repeat([]byte("a"), MaxTextBytes+1), Limits{}, CodeTooLarge},
		{"text over a smaller max_bytes", "big.txt", bytes.Repeat([]byte("a"), 2049), Limits{MaxBytes: 2048}, CodeTooLarge},
		{"an image over max_bytes", "a.png", encodePNG(t, 64, 64), Limits{MaxBytes: 100}, CodeTooLarge},
	} {
		_, err := Check(c.name, c.data, c.lim)
		if e, ok := err.(*Error); !ok || e.Code != c.code {
			t.Errorf("%s: %v, want %s", c.what, err, c.code)
		}
	}
	for _, name := range []string{"main.go", "README.md", "Makefile", "data.CSV", "notes.txt", "x.tsx"} {
		if f, err := Check(name, []byte("héllo\n"), Limits{}); err != nil || f.Kind != KindText {
			t.Errorf("%s: %+v %v", name, f, err)
		}
	}
}

func TestName(t *testing.T) {
	for _, bad := range []string{"", "   ", "a/b.png", `a\b.png`, "/etc/passwd", "..", ".", "../x.png",
		"nul\x00.png", "line\nbreak.txt", "tab\there.txt", "bell\a.png", "del\x7f.png", "c1\u0085.png",
		"gpj\u202e.exe", "iso\u2067late.txt", strings.Repeat("a", 252) + ".png", "caf\xe9.png"} {
		if err := Name(bad); err == nil || err.Code != CodeBadName || err.Message == "" {
			t.Errorf("%q: %v", bad, err)
		} else if strings.ContainsAny(err.Message, "\x00\n\a\u202e") {
			t.Errorf("%q: the refusal carries the control character: %q", bad, err.Message)
		}
	}
	for _, good := range []string{"a.png", "photo (1).JPG", "Résumé.md", "日本語.txt", ".env", "a..b.txt", strings.Repeat("é", 126) + ".t"} {
		if err := Name(good); err != nil {
			t.Errorf("%q refused: %v", good, err)
		}
	}
}

func TestParts(t *testing.T) {
	img := encodePNG(t, 2, 2)
	files := []Attached{{Kind: KindImage, Name: "a.png", MIME: MIMEPNG, Data: img},
		{Kind: KindText, Name: "x.md", MIME: "text/plain", Data: []byte("```go\nfmt.Println()\n```")}}
	parts := Parts("Look", files, true)
	raw, _ := json.Marshal(parts)
	want := `[{"type":"text","text":"Look"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` +
		base64.StdEncoding.EncodeToString(img) + `"}},{"type":"text","text":"File \"x.md\":\n` + "````" + `\n` + "```go" +
		`\nfmt.Println()\n` + "```" + `\n` + "````" + `"}]`
	if string(raw) != want {
		t.Fatalf("parts:\n%s\nwant\n%s", raw, want)
	}
	// Without vision an image is a note; without text, no text part.
	parts = Parts("  ", files[:1], false)
	if len(parts) != 1 || parts[0].Type != "text" || !strings.Contains(parts[0].Text, "cannot see images") {
		t.Fatalf("no vision: %+v", parts)
	}
}

func TestSize(t *testing.T) {
	for n, want := range map[int64]string{10 << 20: "10 MB", 512 << 10: "512 KB", 1536 << 10: "1.5 MB", 900: "900 bytes"} {
		if got := Size(n); got != want {
			t.Errorf("Size(%d) = %q, want %q", n, got, want)
		}
	}
}
