package mockllm

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

const (
	// defaultEmbeddingDims is Options.EmbeddingDims' default: short enough
	// to read in a test failure.
	defaultEmbeddingDims = 16
	// maxEmbeddingInputs is OpenAI's limit on inputs per request.
	maxEmbeddingInputs = 2048
)

// embeddings serves POST /v1/embeddings in OpenAI's format (which Ollama
// follows to the key): one deterministic unit vector per input, as floats or
// as base64 of little-endian float32s (what the official SDKs ask for unless
// told otherwise).
//
// An embedding takes one forward pass, so of the pacing knobs only ttft_ms
// (or Options.TTFT) applies: it delays the whole answer. disconnect_after, at
// any value, drops the connection instead of answering.
func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) {
	req, rec, k, ok := s.begin(w, r, APIEmbeddings)
	if !ok {
		return
	}
	model, ok := s.servedModel(w, rec)
	if !ok {
		return
	}
	inputs, err := textInputs(req.Get("input"), "input")
	if err == nil && len(inputs) > maxEmbeddingInputs {
		err = fmt.Errorf("'input' must have at most %d items, got %d", maxEmbeddingInputs, len(inputs))
	}
	if err != nil {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	dims, err := s.embeddingDims(req.Get("dimensions"))
	if err != nil {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	asBase64, err := base64Format(req.Get("encoding_format"))
	if err != nil {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}

	ctx := r.Context()
	if !waitUntil(ctx, rec.Started.Add(s.pacing(k).ttft)) {
		s.cancelled(rec, "ttft", context.Cause(ctx))
		return
	}
	if k.disconnectAfter >= 0 {
		s.abort(rec)
	}
	var b strings.Builder
	b.WriteString(`{"object":"list","data":[`)
	tokens := 0
	for i, in := range inputs {
		if i > 0 {
			b.WriteByte(',')
		}
		v := Embedding(in.text, dims)
		fmt.Fprintf(&b, `{"object":"embedding","index":%d,"embedding":`, i)
		if asBase64 {
			b.WriteString(jstr(embeddingBase64(v)))
		} else {
			b.WriteString(embeddingFloats(v))
		}
		b.WriteByte('}')
		tokens += in.tokens
	}
	fmt.Fprintf(&b, `],"model":%s,"usage":{"prompt_tokens":%d,"total_tokens":%d}}`, jstr(model), tokens, tokens)
	s.answer(w, rec, b.String())
}

// embeddingDims reads "dimensions": the default when unset; like a real
// model, the mock can shorten its vectors but not lengthen them.
func (s *Server) embeddingDims(v gjson.Result) (int, error) {
	full := s.opts.EmbeddingDims
	switch {
	case v.Type == gjson.Null:
		return full, nil
	case v.Type != gjson.Number || v.Float() != float64(v.Int()):
		return 0, fmt.Errorf("dimensions must be an integer, got %s", v.Raw)
	case v.Int() < 1 || v.Int() > int64(full):
		return 0, fmt.Errorf("dimensions must be between 1 and %d, got %d", full, v.Int())
	}
	return int(v.Int()), nil
}

// base64Format reads "encoding_format": whether the vectors go as base64.
func base64Format(v gjson.Result) (bool, error) {
	switch {
	case v.Type == gjson.Null || v.Type == gjson.String && v.String() == "float":
		return false, nil
	case v.Type == gjson.String && v.String() == "base64":
		return true, nil
	}
	return false, fmt.Errorf(`encoding_format must be "float" or "base64", got %s`, v.Raw)
}

// Embedding returns the mock's embedding of text with dims components: a
// unit vector whose direction depends only on text (a hash seeds a
// splitmix64 sequence). A shorter vector is the start of a longer one,
// normalised again, as OpenAI's "dimensions" shortens embeddings. Exposed so
// that tests elsewhere can predict what passes through the gateway; token id
// inputs are embedded as the text "token ids 1 2 3".
func Embedding(text string, dims int) []float32 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(text)) // hash.Hash.Write never fails.
	x := h.Sum64()
	v := make([]float64, dims)
	norm := 0.0
	for i := range v {
		x += 0x9e3779b97f4a7c15
		z := (x ^ x>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		v[i] = float64(z>>11)/(1<<53)*2 - 1 // Uniform in [-1, 1).
		norm += v[i] * v[i]
	}
	out := make([]float32, dims)
	if norm == 0 {
		return out // All components 0: unreachable in practice.
	}
	norm = math.Sqrt(norm)
	for i := range v {
		out[i] = float32(v[i] / norm)
	}
	return out
}

// embeddingFloats renders v as a JSON array, each number the shortest text
// that reads back as the same float32, so that the float and base64 forms
// carry exactly the same vector.
func embeddingFloats(v []float32) string {
	b := []byte{'['}
	for i, f := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendFloat(b, float64(f), 'g', -1, 32)
	}
	return string(append(b, ']'))
}

// embeddingBase64 encodes v as OpenAI does: little-endian float32s, base64.
func embeddingBase64(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return base64.StdEncoding.EncodeToString(b)
}
