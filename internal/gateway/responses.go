package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"gorm.io/gorm"

	"moonji/internal/proxy"
	"moonji/models"
)

// The Responses API's requests on a response by id: cancel it while it
// runs, retrieve or delete it where the engine stores it. The id finds the
// request's usage row (models.UsageByResponseID), and so its owner and the
// backend that served it.

// translatedPrefix starts the id of a response the gateway translated for a
// chat-only backend: resp_ and the inference id.
const translatedPrefix = "resp_inf_"

// maxResponseID bounds a response id taken from a URL.
const maxResponseID = 100

// validResponseID reports whether id can be a response id: short, and
// letters, digits, '_' and '-' only (what engines use), so that it can go
// into an engine's URL path and a query unchanged.
func validResponseID(id string) bool {
	if id == "" || len(id) > maxResponseID {
		return false
	}
	for _, c := range id {
		if !(c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// InferenceOfResponse returns the inference id of the Responses request
// whose response id is id, or "": a translated response names it; a
// passed-through stream running on this replica was registered when the
// engine named it; any other is found by its row (a finished one, or one
// another replica runs once its row is written).
func (g *Gateway) InferenceOfResponse(ctx context.Context, db *gorm.DB, id string) string {
	if !validResponseID(id) {
		return ""
	}
	if strings.HasPrefix(id, translatedPrefix) {
		return strings.TrimPrefix(id, "resp_")
	}
	if inf, ok := g.running.Load(id); ok {
		return inf.(string)
	}
	row, err := models.UsageByResponseID(ctx, db, id)
	if err != nil {
		return ""
	}
	return row.InferenceID
}

// StoredResponse serves GET or DELETE /v1/responses/{id} for p: the
// request is passed to the engine that served the response, which answers
// it if it stores responses (vLLM with store: true). A response that is
// not p's, unknown, or translated (nothing is stored for those) is 404.
func (g *Gateway) StoredResponse(ctx context.Context, db *gorm.DB, p Principal, method, id string) *Response {
	notFound := apiError{message: fmt.Sprintf("No response found with id '%s'.", id), typ: "invalid_request_error",
		code: "response_not_found", param: "response_id"}
	if !validResponseID(id) {
		notFound.message = "No response found with that id."
		return notFound.response(http.StatusNotFound, nil)
	}
	row, err := models.UsageByResponseID(ctx, db, id)
	if err != nil || (!p.Admin && (row.UserID == nil || *row.UserID != p.UserID)) {
		return notFound.response(http.StatusNotFound, nil)
	}
	route, ok := g.tab.Load().routes[row.Model]
	b := (*Backend)(nil)
	if ok {
		b = route.backend(row.Backend)
	}
	if b == nil || !route.serves(proxy.APIResponses) || b.Link != nil {
		notFound.message = fmt.Sprintf("Response '%s' is not stored: it was served by a backend that keeps no responses.", id)
		return notFound.response(http.StatusNotFound, nil)
	}
	resp, err := g.client.Do(ctx, b.Upstream, method, "/responses/"+url.PathEscape(id))
	if err != nil {
		g.log.Warn("stored response: backend unreachable", "backend", b.Name, "err", err)
		return apiError{message: fmt.Sprintf("Backend %s is unreachable.", b.Name), typ: "server_error",
			code: "upstream_unreachable"}.response(http.StatusBadGateway, nil)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return apiError{message: fmt.Sprintf("Backend %s failed while answering.", b.Name), typ: "server_error",
			code: "upstream_read_failed"}.response(http.StatusBadGateway, nil)
	}
	ct := resp.Header.Get("Content-Type")
	if ct == "" {
		ct = "application/json"
	}
	return &Response{Status: resp.StatusCode, ContentType: ct, Body: data}
}
