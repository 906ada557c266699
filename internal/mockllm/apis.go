package mockllm

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/jsonguard"
)

// The inference APIs, as named in Options.APIs and Record.Endpoint.
const (
	APIChat        = "chat"        // POST /v1/chat/completions
	APICompletions = "completions" // POST /v1/completions
	APIEmbeddings  = "embeddings"  // POST /v1/embeddings
	APIResponses   = "responses"   // POST /v1/responses
)

var allAPIs = []string{APIChat, APICompletions, APIEmbeddings, APIResponses}

// checkAPIs reports the first name in apis that is not an API.
func checkAPIs(apis []string) error {
	for _, a := range apis {
		if !slices.Contains(allAPIs, a) {
			return fmt.Errorf("mockllm: unknown API %q (want some of %s)", a, strings.Join(allAPIs, ", "))
		}
	}
	return nil
}

// ParseAPIs reads a comma-separated list of API names, as the --apis flag
// takes it; blanks are skipped and an empty list means every API.
func ParseAPIs(list string) ([]string, error) {
	var apis []string
	for a := range strings.SplitSeq(list, ",") {
		if a = strings.TrimSpace(a); a != "" {
			apis = append(apis, a)
		}
	}
	if err := checkAPIs(apis); err != nil {
		return nil, err
	}
	return apis, nil
}

func (s *Server) servesAPI(api string) bool {
	return len(s.opts.APIs) == 0 || slices.Contains(s.opts.APIs, api)
}

// disabled answers a request to an API that Options.APIs turned off exactly
// as vLLM answers a route it does not have: 404 {"detail":"Not Found"},
// whatever the method. (Ollama would answer a plain-text "404 page not
// found"; vLLM's JSON is what the gateway's clients most often meet.) Unlike
// an unknown route, the request is recorded, with its tag when the body has
// one, so that a test can tell "the gateway tried and got 404" from "the
// gateway never asked".
func (s *Server) disabled(w http.ResponseWriter, r *http.Request, api string) {
	body, readErr := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	rec := &Record{Endpoint: api, Body: body, Started: time.Now(), Status: http.StatusNotFound}
	if readErr == nil && jsonguard.Validate(body, nil) == nil {
		req := gjson.ParseBytes(body)
		rec.Tag = req.Get("mock.tag").String()
		rec.Model = req.Get("model").String()
		rec.Stream = req.Get("stream").Bool()
	}
	s.add(rec)
	s.log.Info("request to a disabled API", "endpoint", api, "tag", rec.Tag, "method", r.Method)
	if err := writeJSON(w, http.StatusNotFound, []byte(`{"detail":"Not Found"}`)); err != nil {
		s.cancelled(rec, "writing error", err)
		return
	}
	s.completed(rec)
}
