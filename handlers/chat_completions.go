package handlers

import (
	"time"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/connwatch"
	"moonji/internal/gateway"
	"moonji/internal/proxy"
)

// ChatCompletions serves POST /v1/chat/completions, with request bodies of
// at most maxBody bytes. Every request gets an X-Inference-Id and leaves
// exactly one usage row, whatever happens.
func (h *Handler) ChatCompletions(maxBody int64) fiber.Handler {
	return h.Inference(proxy.APIChat, maxBody)
}

// Inference serves POST to api's endpoint (/v1/chat/completions,
// /v1/completions, /v1/embeddings, /v1/responses) the same way: the
// gateway runs every API through one lifecycle.
func (h *Handler) Inference(api proxy.API, maxBody int64) fiber.Handler {
	return func(c *fiber.Ctx) (err error) {
		call := gateway.Call{ID: gateway.NewInferenceID(), FreshID: true, Start: time.Now(), API: api}
		SetRequestID(c, call.ID)
		if h.Gateway.Tracing() {
			// Read while the handler runs: the gateway starts the span (and
			// drops these) before it returns or the request's row is written.
			call.TraceParent, call.TraceState = c.Get("traceparent"), c.Get("tracestate")
		}
		// A panic before the gateway has the request still leaves its one
		// row; inside the gateway, the gateway recovers it itself.
		served := false
		defer func() {
			if p := recover(); p != nil {
				if served {
					panic(p) // its row is written: the server's recover answers
				}
				err = writeResponse(c, h.Gateway.Recovered(call, p))
			}
		}()

		// The caller is identified before the body is read (the server
		// streams request bodies): a request without a valid key costs
		// its headers, whatever body it announces or sends. Its row has no
		// model: the name would come from a body nobody vouches for.
		p, err := h.principal(c)
		if err != nil {
			ae := asAuthError(err)
			SkipBody(c)
			return writeResponse(c, h.Gateway.Reject(call, "", ae.status, ae.reason,
				ae.Error(), "invalid_request_error", ae.code, ae.header()))
		}
		call.Principal = p
		// The gateway owns the body from here on (a stream outlives the
		// handler, and Fiber reuses its buffers): ReadBody's buffer is
		// the only copy.
		if call.Body, err = ReadBody(c, maxBody); err != nil {
			be := asBodyError(err)
			return writeResponse(c, h.Gateway.Reject(call, "", be.Status, be.Reason,
				be.Message, "invalid_request_error", be.Code, nil))
		}
		call.Conn = c.Context().Conn()
		if c.Context().Request.Header.IsHTTP11() {
			// An HTTP/1.1 client must accept an interim 1xx answer (RFC 9110
			// 15.2): written only to a client that has half-closed, it tells one
			// that still reads from one that is gone.
			call.Probe = connwatch.InterimProbe
		}
		resp := h.Gateway.Serve(api, call)
		served = true
		return writeResponse(c, resp)
	}
}

// SetRequestID names a /v1 answer: X-Inference-Id, and the same value as
// x-request-id, which the openai SDKs expose as request_id.
func SetRequestID(c *fiber.Ctx, id string) {
	c.Set("X-Inference-Id", id)
	c.Set("X-Request-Id", id)
}
