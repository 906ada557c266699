package attachment

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"

	"golang.org/x/image/webp"
)

// Image types, by their bytes.
const (
	MIMEPNG  = "image/png"
	MIMEJPEG = "image/jpeg"
	MIMEGIF  = "image/gif"
	MIMEWebP = "image/webp"
)

var pngSignature = []byte("\x89PNG\r\n\x1a\n")

// sniffImage names the image type data starts like, or "" for none.
func sniffImage(data []byte) string {
	switch {
	case bytes.HasPrefix(data, pngSignature):
		return MIMEPNG
	case bytes.HasPrefix(data, []byte{0xFF, 0xD8, 0xFF}):
		return MIMEJPEG
	case bytes.HasPrefix(data, []byte("GIF87a")), bytes.HasPrefix(data, []byte("GIF89a")):
		return MIMEGIF
	case len(data) >= 12 && bytes.Equal(data[:4], []byte("RIFF")) && bytes.Equal(data[8:12], []byte("WEBP")):
		return MIMEWebP
	}
	return ""
}

// checkImage checks that data is a whole image of type mime: its header
// decodes (the standard decoders' DecodeConfig, x/image's for WebP), its
// dimensions are within bounds, and its structure is complete (a PNG's
// chunks and their checksums up to IEND, a JPEG's segments up to its end
// marker, a GIF's trailer, a WebP's RIFF length). Pixels are not decoded:
// the engine does that, and a 50-megapixel image decoded here would take
// 200 MB for each upload.
func checkImage(mime string, data []byte) (w, h int, err *Error) {
	var cfg image.Config
	var derr error
	r := bytes.NewReader(data)
	switch mime {
	case MIMEPNG:
		cfg, derr = png.DecodeConfig(r)
	case MIMEJPEG:
		cfg, derr = jpeg.DecodeConfig(r)
	case MIMEGIF:
		cfg, derr = gif.DecodeConfig(r)
	case MIMEWebP:
		cfg, derr = webp.DecodeConfig(r)
	}
	if derr != nil {
		return 0, 0, refuse(CodeMalformed, "the file looks like %s but its header does not decode (%v).", mime, derr)
	}
	if cfg.Width <= 0 || cfg.Height <= 0 {
		return 0, 0, refuse(CodeMalformed, "the image has no pixels (%d×%d).", cfg.Width, cfg.Height)
	}
	if cfg.Width > MaxSide || cfg.Height > MaxSide || int64(cfg.Width)*int64(cfg.Height) > MaxPixels {
		return 0, 0, refuse(CodeDimensions, "the image is %d×%d pixels; at most %d pixels a side and %d megapixels are allowed.",
			cfg.Width, cfg.Height, MaxSide, MaxPixels/1_000_000)
	}
	var ok bool
	switch mime {
	case MIMEPNG:
		ok = wholePNG(data)
	case MIMEJPEG:
		ok = wholeJPEG(data)
	case MIMEGIF:
		ok = data[len(data)-1] == 0x3B // the trailer
	case MIMEWebP:
		size := int64(binary.LittleEndian.Uint32(data[4:8]))
		// The RIFF size counts what follows it; one byte of padding may
		// follow an odd chunk.
		ok = size >= 4 && (8+size == int64(len(data)) || 9+size == int64(len(data)))
	}
	if !ok {
		return 0, 0, refuse(CodeMalformed, "the image is cut short or damaged (%s).", mime)
	}
	return cfg.Width, cfg.Height, nil
}

// wholePNG walks a PNG's chunks: each fits in the file and its CRC matches,
// and the last is IEND, at the end of the file.
func wholePNG(data []byte) bool {
	p := data[len(pngSignature):]
	for len(p) >= 12 {
		n := int64(binary.BigEndian.Uint32(p[:4]))
		if n > int64(len(p))-12 {
			return false
		}
		typ, body := p[4:8], p[8:8+n]
		crc := binary.BigEndian.Uint32(p[8+n : 12+n])
		h := crc32.NewIEEE()
		_, _ = h.Write(typ)
		_, _ = h.Write(body)
		if h.Sum32() != crc {
			return false
		}
		p = p[12+n:]
		if string(typ) == "IEND" {
			return len(p) == 0
		}
	}
	return false
}

// wholeJPEG walks a JPEG's segments from SOI: each marker's segment fits in
// the file, and after each scan the entropy-coded data runs to a marker
// (FF followed by neither 00, a stuffed byte, nor a restart marker), until
// EOI. Bytes after EOI (some cameras pad) are allowed.
func wholeJPEG(data []byte) bool {
	i := 2 // after SOI
	for i+4 <= len(data) {
		if data[i] != 0xFF {
			return false
		}
		m := data[i+1]
		switch {
		case m == 0xFF: // fill byte
			i++
			continue
		case m == 0xD9: // EOI
			return true
		case m == 0x01 || (m >= 0xD0 && m <= 0xD7): // standalone markers
			i += 2
			continue
		}
		n := int(binary.BigEndian.Uint16(data[i+2 : i+4]))
		if n < 2 || i+2+n > len(data) {
			return false
		}
		i += 2 + n
		if m != 0xDA { // not a scan
			continue
		}
		for { // entropy-coded data up to the next marker
			for i < len(data) && data[i] != 0xFF {
				i++
			}
			if i+1 >= len(data) {
				return false
			}
			if next := data[i+1]; next == 0x00 || (next >= 0xD0 && next <= 0xD7) {
				i += 2
				continue
			}
			break
		}
	}
	return i+2 <= len(data) && data[i] == 0xFF && data[i+1] == 0xD9
}
