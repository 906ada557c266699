package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"moonji/internal/budget"
	"moonji/internal/money"
	"moonji/internal/proxy"
	"moonji/internal/spending"
)

// Money: what a sender may use (model lists) and spend (budgets). A request
// under budgets reserves its most expensive outcome before an engine or a
// queue place is taken, and the reservation is replaced by its real cost
// when its row is final (finish → settle).

// promptMargin is added to a request body's length for the prompt part of
// a reservation. A token is at least one byte of the text it stands for,
// and the body holds every text the engine tokenizes (messages, tools,
// schemas) plus JSON's own punctuation; the margin covers what an engine's
// chat template adds beyond the body (role markers, a default system
// prompt: a few dozen tokens for the templates of Llama 3, Qwen and
// Mistral).
const promptMargin = 256

// reservationTTL is how long a reservation holds when its route has no
// timeout: a replica that dies mid-request frees it then.
const reservationTTL = time.Hour

// policy returns what the sender may use and spend, or the answer that
// refuses the request (for model).
func (g *Gateway) policy(call Call, model string) (spending.Policy, *Response) {
	if g.policies == nil || call.Principal.UserID == 0 {
		return spending.Policy{}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := g.policies.For(ctx, call.Principal.UserID, call.Principal.KeyID)
	if err != nil {
		g.log.Error("read the sender's budgets and models", "err", err, "inference_id", call.ID)
		return p, g.reject(call, model, http.StatusServiceUnavailable, "budget_unavailable", apiError{
			message: "Your budgets could not be read; try again.", typ: "server_error", code: "budget_unavailable"},
			http.Header{"Retry-After": {"1"}})
	}
	return p, nil
}

// maxCost is the most a request to r may cost: every byte of its body
// a prompt token (and promptMargin more) — but an image proxy.ImageTokens,
// whatever its bytes —, and the output it allows — its own limit, or the
// route's — for each choice it asks for.
func (r *Route) maxCost(req proxy.Request, bodyLen, choices int) int64 {
	if r.Price.Free() {
		return 0
	}
	var out int64
	if req.API != proxy.APIEmbeddings {
		out = int64(r.ReserveOutput)
		if req.MaxTokens > 0 {
			out = int64(req.MaxTokens)
		}
		out *= int64(max(choices, 1))
	}
	prompt := int64(bodyLen-req.ImageBytes) + int64(req.Images)*proxy.ImageTokens + promptMargin
	return money.Cost(r.Price, money.Tokens{Prompt: prompt, Completion: out})
}

// reservation is a budget check under way: Reserve runs on a goroutine of
// its own while the rest of admission goes on. A nil *reservation is a
// request with nothing to reserve (no budget applies, or a free model).
type reservation struct {
	amount  int64
	done    chan struct{}
	held    *budget.Reservation
	refusal *budget.Refusal
	err     error
}

// beginReserve starts holding a request's most expensive outcome against
// every budget that applies to it.
func (g *Gateway) beginReserve(call Call, req proxy.Request, route *Route, limits []budget.Limit) *reservation {
	if len(limits) == 0 || g.budgets == nil || route.Price.Free() {
		return nil
	}
	r := &reservation{amount: route.maxCost(req, len(call.Body), choicesOf(call.Body)), done: make(chan struct{})}
	ttl := reservationTTL
	if route.Timeout > 0 {
		ttl = route.Timeout + time.Minute
	}
	go func() {
		defer close(r.done)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r.held, r.refusal, r.err = g.budgets.Reserve(ctx, call.ID, limits, r.amount, ttl, time.Now())
	}()
	return r
}

// giveBack returns what a request that never started holds, off its path.
func (r *reservation) giveBack() {
	if r == nil {
		return
	}
	go func() {
		<-r.done
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r.held.Settle(ctx, 0)
	}()
}

// reserved waits for the check and returns its reservation, or the answer
// that refuses the request: a budget it does not fit (429
// insufficient_quota), or budgets that cannot be checked now (503: while
// Redis is away a request under a budget is refused, never let through
// unaccounted).
func (g *Gateway) reserved(call Call, req proxy.Request, r *reservation, hdr http.Header) (*budget.Reservation, *Response) {
	if r == nil {
		return nil, nil
	}
	<-r.done
	switch {
	case r.err != nil:
		g.log.Warn("budgets could not be checked; refusing the request", "err", r.err, "inference_id", call.ID,
			"unavailable", errors.Is(r.err, budget.ErrUnavailable))
		hdr.Set("Retry-After", "1")
		return nil, g.reject(call, req.Model, http.StatusServiceUnavailable, "budget_unavailable", apiError{
			message: "Budgets cannot be checked right now; try again shortly.", typ: "server_error",
			code: "budget_unavailable"}, hdr)
	case r.refusal != nil:
		if renews := r.refusal.Renews; !renews.IsZero() {
			secs := int(time.Until(renews).Seconds()) + 1
			hdr.Set("Retry-After", strconv.Itoa(max(secs, 1)))
		}
		return nil, g.reject(call, req.Model, http.StatusTooManyRequests, "budget_exceeded", apiError{
			message: fmt.Sprintf("Budget exceeded: %s. This request may cost up to %s %s.", r.refusal.Message(),
				money.FormatShort(r.amount), g.currency),
			typ: "insufficient_quota", code: "budget_exceeded"}, hdr)
	}
	return r.held, nil
}

// settle replaces the request's reservation with its cost, once, off the
// request's path: its answer does not wait for the round trip. Until it
// lands the reservation holds the budget (never less than the cost); a
// settle lost with the process lapses at the reservation's deadline.
func (x *exchange) settle() {
	held, cost := x.budget, x.row.Cost
	if held == nil {
		return
	}
	x.budget = nil
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		held.Settle(ctx, cost)
	}()
}
