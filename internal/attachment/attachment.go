// Package attachment checks the files people attach to chat messages —
// images (PNG, JPEG, GIF, WebP) and text files — and turns them into the
// content parts an engine receives. A file's type is what its bytes are,
// never what its name says; its name is checked on its own (Name). It knows
// nothing of HTTP: handlers read the upload, the chat sends the parts.
package attachment

import (
	"fmt"
)

// Kinds of attachment.
const (
	KindImage = "image"
	KindText  = "text"
)

// Defaults of the limits (configuration: attachments.max_bytes and
// attachments.max_per_message).
const (
	DefaultMaxBytes      = 10 << 20
	DefaultMaxPerMessage = 4
	// MaxTextBytes bounds a text file: it goes into the prompt whole.
	MaxTextBytes = 512 << 10
	// MaxPixels bounds an image's width × height: a small file can
	// declare a huge image (a decompression bomb) that an engine would
	// decode into gigabytes. 50 megapixels is beyond any camera people
	// chat with.
	MaxPixels = 50_000_000
	// MaxSide bounds each side: engines resize to a few thousand pixels.
	MaxSide = 20_000
)

// Limits bound what may be attached.
type Limits struct {
	// MaxBytes bounds one image (a text file is bounded by MaxTextBytes
	// too, whichever is smaller).
	MaxBytes int64
	// MaxPerMessage bounds the attachments of one message.
	MaxPerMessage int
}

// WithDefaults fills the zero limits with the defaults.
func (l Limits) WithDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxPerMessage <= 0 {
		l.MaxPerMessage = DefaultMaxPerMessage
	}
	return l
}

// TextLimit is the largest text file allowed.
func (l Limits) TextLimit() int64 { return min(l.WithDefaults().MaxBytes, MaxTextBytes) }

// UploadLimit is the largest file of either kind: what an upload may carry.
func (l Limits) UploadLimit() int64 { return max(l.WithDefaults().MaxBytes, l.TextLimit()) }

// Codes of the refusals, as the API's error code.
const (
	CodeTooLarge     = "file_too_large"
	CodeType         = "unsupported_file_type"
	CodeMalformed    = "malformed_image"
	CodeDimensions   = "image_too_large"
	CodeBadText      = "invalid_text_file"
	CodeBadName      = "invalid_file_name"
	CodeEmpty        = "empty_file"
	CodeNotVision    = "model_cannot_see_images"
	CodeTooMany      = "too_many_attachments"
	CodeUnknown      = "unknown_attachment"
	CodeTooManyFresh = "too_many_uploads"
)

// Error is a file refused, with why in words a person can act on.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

func refuse(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// File is what Check found a file to be.
type File struct {
	Kind string // KindImage or KindText
	Name string
	// MIME is the type its bytes are (image/png, …; text/plain for text).
	MIME string
	// Width and Height are an image's dimensions (0 for text).
	Width, Height int
}

// Check tells what data, uploaded under name, is, or why it is refused: a
// name Name refuses, an empty or too large file, an image that does not
// decode as the type its bytes announce or whose dimensions are out of
// bounds, or something that is neither an allowed image nor a text file
// with an allowed name (valid UTF-8, no NUL).
func Check(name string, data []byte, lim Limits) (File, error) {
	lim = lim.WithDefaults()
	if err := Name(name); err != nil {
		return File{}, err
	}
	if len(data) == 0 {
		return File{}, refuse(CodeEmpty, "%q is empty.", name)
	}
	if mime := sniffImage(data); mime != "" {
		if int64(len(data)) > lim.MaxBytes {
			return File{}, refuse(CodeTooLarge, "%q is %s; an image may be at most %s.", name, Size(int64(len(data))), Size(lim.MaxBytes))
		}
		w, h, err := checkImage(mime, data)
		if err != nil {
			return File{}, &Error{Code: err.Code, Message: fmt.Sprintf("%q: %s", name, err.Message)}
		}
		return File{Kind: KindImage, Name: name, MIME: mime, Width: w, Height: h}, nil
	}
	if !textName(name) {
		return File{}, refuse(CodeType, "%q is not an allowed file: attach a PNG, JPEG, GIF or WebP image, or a text file (%s).", name, textKinds)
	}
	if limit := lim.TextLimit(); int64(len(data)) > limit {
		return File{}, refuse(CodeTooLarge, "%q is %s; a text file may be at most %s.", name, Size(int64(len(data))), Size(limit))
	}
	if err := checkText(data); err != nil {
		return File{}, &Error{Code: err.Code, Message: fmt.Sprintf("%q %s", name, err.Message)}
	}
	return File{Kind: KindText, Name: name, MIME: "text/plain; charset=utf-8"}, nil
}

// Size words a byte count for people: 512 KB, 10 MB, 1.5 MB (powers of
// 1024, as file managers mostly show them).
func Size(n int64) string {
	switch {
	case n >= 1<<20:
		if n%(1<<20) == 0 {
			return fmt.Sprintf("%d MB", n>>20)
		}
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%d KB", (n+1<<10-1)>>10)
	default:
		return fmt.Sprintf("%d bytes", n)
	}
}
