package mockllm

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

type embeddingsAnswer struct {
	Object string `json:"object"`
	Data   []struct {
		Object    string          `json:"object"`
		Index     int             `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Model string `json:"model"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

// embed posts an embeddings request and decodes the vectors, from floats or
// from base64 as the body says.
func embed(t *testing.T, url, body string) (embeddingsAnswer, [][]float32) {
	t.Helper()
	status, ctype, got := doAt(t, url, "/v1/embeddings", body)
	var a embeddingsAnswer
	if status != http.StatusOK || ctype != "application/json" || json.Unmarshal([]byte(got), &a) != nil {
		t.Fatalf("%s: %d %q %s", body, status, ctype, got)
	}
	var vecs [][]float32
	for i, d := range a.Data {
		if d.Index != i || d.Object != "embedding" {
			t.Errorf("data[%d] = index %d object %q", i, d.Index, d.Object)
		}
		var floats []float64
		var b64 string
		var v []float32
		switch {
		case json.Unmarshal(d.Embedding, &floats) == nil:
			for _, f := range floats {
				v = append(v, float32(f))
			}
		case json.Unmarshal(d.Embedding, &b64) == nil:
			raw, err := base64.StdEncoding.DecodeString(b64)
			if err != nil || len(raw)%4 != 0 {
				t.Fatalf("data[%d]: bad base64 %q: %v", i, b64, err)
			}
			for j := 0; j < len(raw); j += 4 {
				v = append(v, math.Float32frombits(binary.LittleEndian.Uint32(raw[j:])))
			}
		default:
			t.Fatalf("data[%d].embedding is %s", i, d.Embedding)
		}
		vecs = append(vecs, v)
	}
	return a, vecs
}

func norm(v []float32) float64 {
	n := 0.0
	for _, f := range v {
		n += float64(f) * float64(f)
	}
	return math.Sqrt(n)
}

func TestEmbeddingsShapeMatchesOllama(t *testing.T) {
	_, ts := start(t, Options{})
	status, _, got := doAt(t, ts.URL, "/v1/embeddings", `{"model":"mock","input":["Why is the sky blue?","Hello"]}`)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, got)
	}
	sameShape(t, "embeddings", got, recording(t, "embeddings.json"))
}

// The SDKs ask for base64 unless told otherwise: it must decode to exactly
// the floats of encoding_format "float", for every input form.
func TestEmbeddingsFloatAndBase64Agree(t *testing.T) {
	_, ts := start(t, Options{})
	for _, input := range []string{`"hello world"`, `["hello world","one two three"]`, `[1,2,3]`, `[[1,2,3],[4]]`} {
		fa, fv := embed(t, ts.URL, `{"model":"mock","input":`+input+`,"encoding_format":"float"}`)
		ba, bv := embed(t, ts.URL, `{"model":"mock","input":`+input+`,"encoding_format":"base64"}`)
		_, dv := embed(t, ts.URL, `{"model":"mock","input":`+input+`,"encoding_format":null}`)
		if len(fv) == 0 || len(fv) != len(bv) || len(fv) != len(dv) || fa.Usage != ba.Usage {
			t.Fatalf("%s: %d float, %d base64, %d default vectors; usage %+v %+v", input, len(fv), len(bv), len(dv), fa.Usage, ba.Usage)
		}
		for i := range fv {
			if len(fv[i]) != defaultEmbeddingDims || !slicesEqual(fv[i], bv[i]) || !slicesEqual(fv[i], dv[i]) {
				t.Errorf("%s[%d]: float %v\nbase64 %v\ndefault %v", input, i, fv[i], bv[i], dv[i])
			}
			if n := norm(fv[i]); math.Abs(n-1) > 1e-6 {
				t.Errorf("%s[%d]: norm %v", input, i, n)
			}
		}
	}
}

func slicesEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Vectors depend on the input only, match Embedding, and "dimensions"
// shortens them the way OpenAI's does: the start of the full vector, of
// length 1 again.
func TestEmbeddingsDeterministicAndDimensions(t *testing.T) {
	_, ts := start(t, Options{})
	_, v := embed(t, ts.URL, `{"model":"mock","input":["cat","dog","cat"]}`)
	if !slicesEqual(v[0], v[2]) || slicesEqual(v[0], v[1]) {
		t.Errorf("same input, different vectors or different inputs, same vector: %v %v %v", v[0], v[1], v[2])
	}
	_, ids := embed(t, ts.URL, `{"model":"mock","input":[7,8]}`)
	if !slicesEqual(v[0], Embedding("cat", 16)) || !slicesEqual(ids[0], Embedding("token ids 7 8", 16)) {
		t.Errorf("vectors differ from Embedding: %v %v", v[0], ids[0])
	}
	_, short := embed(t, ts.URL, `{"model":"mock","input":"cat","dimensions":5}`)
	if len(short[0]) != 5 || math.Abs(norm(short[0])-1) > 1e-6 {
		t.Fatalf("dimensions 5: %v", short[0])
	}
	scale := float64(short[0][0]) / float64(v[0][0])
	for i := range short[0] {
		if r := float64(short[0][i]) / float64(v[0][i]); math.Abs(r-scale) > 1e-5 {
			t.Errorf("component %d: ratio %v, first %v: not the start of the full vector", i, r, scale)
		}
	}

	_, ts8 := start(t, Options{EmbeddingDims: 8})
	if _, v8 := embed(t, ts8.URL, `{"model":"mock","input":"cat"}`); len(v8[0]) != 8 {
		t.Errorf("EmbeddingDims 8 gave %d components", len(v8[0]))
	}
}

func TestEmbeddingsUsage(t *testing.T) {
	s, ts := start(t, Options{})
	cases := []struct {
		input           string
		tokens, vectors int
	}{
		{`"hello world"`, 2, 1},
		{`["hello world","one two three"]`, 5, 2},
		{`["  x  ","!"," "]`, 3, 3},
		{`[1,2,3]`, 3, 1},
		{`[[1,2,3],[4]]`, 4, 2},
		{`"` + strings.Repeat("w ", 50) + `"`, 50, 1},
	}
	for _, c := range cases {
		a, v := embed(t, ts.URL, `{"model":"mock","input":`+c.input+`,"mock":{"tag":"u"}}`)
		if a.Usage.PromptTokens != c.tokens || a.Usage.TotalTokens != c.tokens || a.Object != "list" || a.Model != "mock" || len(v) != c.vectors {
			t.Errorf("%s: %+v, want %d tokens, %d vectors", c.input, a, c.tokens, c.vectors)
		}
	}
	rec, err := s.WaitFor(waitCtx(t), "u", nil)
	if err != nil || rec.Endpoint != APIEmbeddings || !rec.Completed || rec.Status != 200 || rec.ChunksSent != 0 {
		t.Errorf("record %+v, err %v", rec, err)
	}
}

func TestEmbeddingsErrors(t *testing.T) {
	_, ts := start(t, Options{})
	cases := []struct {
		body   string
		status int
		msg    string
	}{
		{`{"model":"mock"}`, 400, "'input' must be a string, an array of strings, an array of token ids or an array of arrays of token ids"},
		{`{"model":"mock","input":""}`, 400, "'input' must not be empty"},
		{`{"model":"mock","input":[]}`, 400, "'input' must not be empty"},
		{`{"model":"mock","input":["a",""]}`, 400, "'input[1]' must not be empty"},
		{`{"model":"mock","input":[1.5]}`, 400, "'input[0]' must be a token id (an integer of at least 0), got 1.5"},
		{`{"model":"mock","input":"x","encoding_format":"hex"}`, 400, `encoding_format must be "float" or "base64", got "hex"`},
		{`{"model":"mock","input":"x","dimensions":0}`, 400, "dimensions must be between 1 and 16, got 0"},
		{`{"model":"mock","input":"x","dimensions":17}`, 400, "dimensions must be between 1 and 16, got 17"},
		{`{"model":"mock","input":"x","dimensions":"4"}`, 400, `dimensions must be an integer, got "4"`},
		{`{"model":"nope","input":"x"}`, 404, "The model `nope` does not exist."},
		{`{"model":"mock","input":[` + strings.Repeat(`"x",`, 2048) + `"x"]}`, 400, "'input' must have at most 2048 items, got 2049"},
	}
	for _, c := range cases {
		status, ctype, got := doAt(t, ts.URL, "/v1/embeddings", c.body)
		if status != c.status || ctype != "application/json" || got != `{"error":{"message":`+jstr(c.msg)+`,"type":`+jstr(errorType(c.status))+`,"param":null,"code":`+jsonInt(c.status)+`}}` {
			t.Errorf("%.80s: %d %q %s\nwant %d with message %q", c.body, status, ctype, got, c.status, c.msg)
		}
	}
}

func jsonInt(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func TestEmbeddingsOpenAISDK(t *testing.T) {
	_, ts := start(t, Options{})
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	resp, err := client.Embeddings.New(t.Context(), openai.EmbeddingNewParams{
		Model:          "mock",
		Input:          openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a b", "c"}},
		EncodingFormat: openai.EmbeddingNewParamsEncodingFormatFloat,
		Dimensions:     openai.Int(4),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Data) != 2 || resp.Usage.PromptTokens != 3 || resp.Usage.TotalTokens != 3 {
		t.Fatalf("response %+v", resp)
	}
	for i, text := range []string{"a b", "c"} {
		want := Embedding(text, 4)
		got := resp.Data[i].Embedding
		for j := range want {
			if float32(got[j]) != want[j] {
				t.Errorf("data[%d] = %v, want %v", i, got, want)
				break
			}
		}
	}
}
