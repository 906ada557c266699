package attachment

import (
	"bytes"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"golang.org/x/image/webp"
)

// FuzzName: Name never panics, and a name it accepts is a plain name — no
// separator, no control or direction character, valid UTF-8, within bounds
// — while its refusals never carry a control character.
// The seed corpus is in testdata/fuzz/FuzzName.
func FuzzName(f *testing.F) {
	for _, s := range []string{"a.png", "a/b", `a\b`, "..", "x\x00y", "gpj\u202eexe.png", "Résumé.md", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := Name(name)
		if err != nil {
			if strings.ContainsFunc(err.Message, func(r rune) bool { return unicode.IsControl(r) || bidiControl(r) }) {
				t.Fatalf("refusal of %q carries a control character: %q", name, err.Message)
			}
			return
		}
		if !utf8.ValidString(name) || len(name) > MaxNameBytes || strings.ContainsAny(name, `/\`) || name == ".." ||
			strings.ContainsFunc(name, func(r rune) bool { return unicode.IsControl(r) || bidiControl(r) }) || strings.TrimSpace(name) == "" {
			t.Fatalf("accepted %q", name)
		}
	})
}

// FuzzCheck: Check never panics on any bytes, and what it accepts as an
// image is one: the standard decoders (x/image's for WebP) read its header
// with the same dimensions, within bounds; what it accepts as text is
// valid UTF-8 without NUL. The seed corpus (whole, cut and damaged images)
// is in testdata/fuzz/FuzzCheck.
func FuzzCheck(f *testing.F) {
	f.Add([]byte("\x89PNG\r\n\x1a\n"), "a.png")
	f.Add([]byte("\xff\xd8\xff\xd9"), "a.jpg")
	f.Add([]byte("GIF89a\x01\x00\x01\x00;"), "a.gif")
	f.Add(webpLossless, "a.webp")
	f.Add([]byte("hello"), "a.txt")
	f.Fuzz(func(t *testing.T, data []byte, name string) {
		file, err := Check(name, data, Limits{})
		if err != nil {
			return
		}
		switch file.Kind {
		case KindImage:
			decode := map[string]func(r *bytes.Reader) (image.Config, error){
				MIMEPNG:  func(r *bytes.Reader) (image.Config, error) { return png.DecodeConfig(r) },
				MIMEJPEG: func(r *bytes.Reader) (image.Config, error) { return jpeg.DecodeConfig(r) },
				MIMEGIF:  func(r *bytes.Reader) (image.Config, error) { return gif.DecodeConfig(r) },
				MIMEWebP: func(r *bytes.Reader) (image.Config, error) { return webp.DecodeConfig(r) },
			}[file.MIME]
			cfg, derr := decode(bytes.NewReader(data))
			if derr != nil || cfg.Width != file.Width || cfg.Height != file.Height || file.Width <= 0 || file.Height <= 0 ||
				int64(file.Width)*int64(file.Height) > MaxPixels {
				t.Fatalf("accepted %s %dx%d: decoder says %+v %v", file.MIME, file.Width, file.Height, cfg, derr)
			}
		case KindText:
			if !utf8.Valid(data) || bytes.IndexByte(data, 0) >= 0 || len(data) > MaxTextBytes {
				t.Fatalf("accepted as text: %q", data)
			}
		default:
			t.Fatalf("kind %q", file.Kind)
		}
	})
}
