// Package handlers holds Moonji's HTTP handlers: thin functions that read
// the request, call into the domain packages and write the answer.
package handlers

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
	"gorm.io/gorm"

	"moonji/internal/apikey"
	"moonji/internal/attachment"
	"moonji/internal/audit"
	"moonji/internal/auth"
	"moonji/internal/budget"
	"moonji/internal/chat"
	"moonji/internal/clientip"
	"moonji/internal/fairshare"
	"moonji/internal/gateway"
	"moonji/internal/reload"
	"moonji/internal/spending"
	"moonji/models"
)

// Handler carries what the handlers share.
type Handler struct {
	DB      *gorm.DB
	Gateway *gateway.Gateway
	APIKeys *apikey.Store
	Stopper *gateway.Stopper
	Log     *slog.Logger
	// Audit records every change that is not an inference (nil: none).
	Audit *audit.Log
	// Reloader reloads the configuration file (the admin page's button)
	// and tells the version each replica runs; nil: no button.
	Reloader Reloader
	// AuditSignInFailures bounds the failed sign-ins recorded per address
	// (recordFailedSignIn); nil: no bound.
	AuditSignInFailures *auth.RequestLimiter
	// Auth signs people in and holds their sessions; pages, /api and the
	// session path of /v1 need it.
	Auth *auth.Service
	// Chat serves the browser chat's conversations and generations.
	Chat *chat.Service
	// Attachments stores and serves the files attached to chat messages.
	Attachments *attachment.Service
	// TrustedProxies are the proxies whose X-Forwarded-For names the client
	// (see clientIP); without any, the TCP peer is the client.
	TrustedProxies []netip.Prefix
	// Keyless limits /v1 requests that carry no valid credential, per client
	// address; nil means no limit.
	Keyless *auth.RequestLimiter
	// MaxKeysPerPerson is how many live keys a non-admin may hold, and
	// MaxKeyRPM the highest per-key requests per minute they may set (0, the
	// configured default, is always allowed): people may lower their limit,
	// not raise it. Admins are bound by neither. Zero values allow nothing.
	MaxKeysPerPerson int
	MaxKeyRPM        int
	// StreamWriteTimeout ends an event stream whose viewer makes no write
	// progress for this long (stops reading, keeps the socket).
	// Keepalive is the interval of the comments that keep a quiet event
	// stream open through proxies (0: heartbeatEvery).
	Keepalive          time.Duration
	StreamWriteTimeout time.Duration
	// Streams bounds each person's open event streams on this replica.
	Streams *fairshare.Holds
	// Withdrawals end what a person holds once an admin disables them.
	Withdrawals *fairshare.Withdrawals
	// Currency is the unit of every price, cost and budget shown.
	Currency string
	// Policies are the senders' budgets and model lists as the gateway
	// reads them; a page that changes one calls Policies.Forget, so that
	// this replica applies it at once (others within the cache's 5 s).
	// Budgets tells what each budget's period has spent (the /usage page,
	// a team's page). Either may be nil: nothing is forgotten, no spending
	// is shown.
	Policies *spending.Resolver
	Budgets  *budget.Store

	// keyCreation makes counting a person's keys and creating one a single
	// step on this replica, so that parallel forms cannot pass the count together.
	keyCreation sync.Mutex
}

// Reloader is the server's configuration reload (web.Server).
type Reloader interface {
	Reload(ctx context.Context, by reload.By) (reload.Result, error)
	ConfigVersion() reload.Version
	ReplicaVersions(ctx context.Context) ([]models.Replica, error)
}

// clientIP is the address a request comes from, for limits and logs: the
// TCP peer, or, when the peer is a trusted proxy, the first untrusted hop of
// X-Forwarded-For counted from the right. Fiber's own ProxyHeader is not
// used: it believes the header from anyone.
func (h *Handler) clientIP(c *fiber.Ctx) string {
	return h.clientAddr(c).String()
}

func (h *Handler) clientAddr(c *fiber.Ctx) netip.Addr {
	peer, _ := netip.AddrFromSlice(c.Context().RemoteIP())
	if len(h.TrustedProxies) == 0 {
		return peer.Unmap()
	}
	var forwarded []string
	for _, v := range c.Request().Header.PeekAll(fiber.HeaderXForwardedFor) {
		forwarded = append(forwarded, string(v))
	}
	return clientip.Client(peer, forwarded, h.TrustedProxies)
}

// limitKey is what the per-address limits count a request under (an IPv6
// client's whole /64).
func (h *Handler) limitKey(c *fiber.Ctx) string {
	return clientip.Bucket(h.clientAddr(c))
}

// apiError writes an error in OpenAI's format.
func apiError(c *fiber.Ctx, status int, message, typ, code string) error {
	return apiErrorParam(c, status, message, typ, code, "")
}

// apiErrorParam writes an error in OpenAI's format whose param names the
// request field at fault: SDKs show it, and a client can point at the field.
func apiErrorParam(c *fiber.Ctx, status int, message, typ, code, param string) error {
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(status).Send(gateway.ErrorBodyParam(message, typ, code, param))
}

// badBody answers a JSON body the API refuses: 400 in OpenAI's shape, param
// naming the field at fault when it is known.
func badBody(c *fiber.Ctx, err error) error {
	var bad *bodyError
	if !errors.As(err, &bad) {
		bad = &bodyError{Message: "request body is not valid JSON"}
	}
	return apiErrorParam(c, http.StatusBadRequest, bad.Message, "invalid_request_error", "invalid_request", bad.Param)
}

// writeResponse writes a gateway response. A streamed body is pulled by
// fasthttp after the handler returns, chunk by chunk, each flushed.
func writeResponse(c *fiber.Ctx, r *gateway.Response) error {
	for k, vs := range r.Header {
		for _, v := range vs {
			c.Set(k, v)
		}
	}
	c.Status(r.Status)
	c.Set(fiber.HeaderContentType, r.ContentType)
	if r.BodyStream != nil {
		// Send the headers (X-Inference-Id among them) at once, not with the
		// first frame: a client may want to stop before the first token.
		// When that frame is already here, both go in one write: the
		// client's first byte comes sooner (one system call and one
		// wake-up of the client fewer).
		c.Context().Response.ImmediateHeaderFlush = !r.HeaderWithFirstFrame
		c.Context().SetBodyStream(r.BodyStream, -1)
		return nil
	}
	return c.Send(r.Body)
}
