package mockllm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// postTo posts body to path (e.g. "/v1/responses") on the mock at url.
func postTo(t *testing.T, ctx context.Context, url, path, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatalf("building request: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	return http.DefaultClient.Do(req)
}

// doAt posts body to path and returns status, Content-Type and the body.
func doAt(t *testing.T, url, path, body string) (int, string, string) {
	t.Helper()
	resp, err := postTo(t, t.Context(), url, path, body)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

// generationStopped checks that rec, cancelled after its client read min
// tokens, had sent a few more at most and sends no more.
func generationStopped(t *testing.T, s *Server, rec Record, min int) {
	t.Helper()
	if rec.ChunksSent < min || rec.ChunksSent > min+7 {
		t.Errorf("chunks sent %d after the client read %d", rec.ChunksSent, min)
	}
	time.Sleep(150 * time.Millisecond)
	for _, r := range s.Requests() {
		if r.Tag == rec.Tag && r.ChunksSent != rec.ChunksSent {
			t.Errorf("chunks went on after cancel: %d -> %d", rec.ChunksSent, r.ChunksSent)
		}
	}
}

// sseEvent is one Server-Sent Event: its "event:" line ("" without one) and
// its data.
type sseEvent struct {
	event, data string
}

// parseSSE splits a whole event stream into events. It fails the test on a
// line that is neither "event:" nor "data:", or on a stream that does not
// end with a blank line.
func parseSSE(t *testing.T, body string) []sseEvent {
	t.Helper()
	if body != "" && !strings.HasSuffix(body, "\n\n") {
		t.Fatalf("stream does not end with a blank line: %q", body[max(0, len(body)-80):])
	}
	var events []sseEvent
	for frame := range strings.SplitSeq(strings.TrimSuffix(body, "\n\n"), "\n\n") {
		var e sseEvent
		for line := range strings.SplitSeq(frame, "\n") {
			switch {
			case strings.HasPrefix(line, "event: "):
				e.event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				e.data = strings.TrimPrefix(line, "data: ")
			default:
				t.Fatalf("unexpected SSE line %q", line)
			}
		}
		events = append(events, e)
	}
	return events
}

// decode parses JSON into generic values, failing the test on bad JSON.
func decode(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("invalid JSON %q: %v", s, err)
	}
	return v
}

// recording reads a file of the Ollama recordings.
func recording(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtures, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// shapeDiff lists where got and want differ in shape: a key that only one of
// two objects has (unless allow holds its path, e.g. "$.choices[].logprobs"),
// or two values of different JSON kinds. null goes with any kind, since
// nullable fields are null in one answer and set in another; arrays are
// compared by their first elements.
func shapeDiff(path string, got, want any, allow map[string]bool) []string {
	if got == nil || want == nil {
		return nil
	}
	if kind(got) != kind(want) {
		return []string{fmt.Sprintf("%s: %s, recorded %s", path, kind(got), kind(want))}
	}
	var diffs []string
	switch g := got.(type) {
	case map[string]any:
		w := want.(map[string]any)
		for _, k := range sortedKeys(g, w) {
			gv, inGot := g[k]
			wv, inWant := w[k]
			p := path + "." + k
			switch {
			case inGot && inWant:
				diffs = append(diffs, shapeDiff(p, gv, wv, allow)...)
			case allow[p]:
			case inGot:
				diffs = append(diffs, p+": the mock has it, the recording does not")
			default:
				diffs = append(diffs, p+": the recording has it, the mock does not")
			}
		}
	case []any:
		if w := want.([]any); len(g) > 0 && len(w) > 0 {
			diffs = shapeDiff(path+"[]", g[0], w[0], allow)
		}
	}
	return diffs
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "bool"
	case float64:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	default:
		return "object"
	}
}

func sortedKeys(a, b map[string]any) []string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// sameShape fails the test when got (JSON) differs in shape from want.
func sameShape(t *testing.T, what, got, want string, allow ...string) {
	t.Helper()
	allowed := map[string]bool{}
	for _, a := range allow {
		allowed[a] = true
	}
	for _, d := range shapeDiff("$", decode(t, got), decode(t, want), allowed) {
		t.Errorf("%s: %s", what, d)
	}
}

// The comparison itself must be able to fail: a renamed key, a missing key
// and a changed kind are all caught, nested in arrays too.
func TestShapeDiffCatchesDifferences(t *testing.T) {
	want := decode(t, `{"a":1,"b":[{"c":"x","d":null}],"e":{"f":true}}`)
	cases := map[string]string{
		`{"a":1,"b":[{"c":"x","d":null}],"e":{"f":true},"z":0}`: "$.z: the mock has it, the recording does not",
		`{"a":1,"b":[{"c":"x"}],"e":{"f":true}}`:                "$.b[].d: the recording has it, the mock does not",
		`{"a":"1","b":[{"c":"x","d":null}],"e":{"f":true}}`:     "$.a: string, recorded number",
		`{"a":1,"b":[{"c":"x","d":5}],"e":{"g":true}}`:          "$.e.f: the recording has it, the mock does not",
	}
	for got, first := range cases {
		diffs := shapeDiff("$", decode(t, got), want, nil)
		if len(diffs) == 0 || diffs[0] != first {
			t.Errorf("%s: diffs %q, want first %q", got, diffs, first)
		}
	}
	if d := shapeDiff("$", decode(t, `{"a":null,"b":[],"e":{"f":false},"z":1}`), want, map[string]bool{"$.z": true}); len(d) != 0 {
		t.Errorf("null, empty array and allowed key should pass: %q", d)
	}
}
