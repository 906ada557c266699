package auth

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/zitadel/oidc/v3/pkg/client/rp"
)

// lazyParty creates the relying party on first use. Creating it fetches the
// provider's discovery document over HTTP, which cannot work while the
// server that also serves the embedded provider is still starting; and a
// provider that is down at start should not keep Moonji from serving keys.
// A failed attempt is retried on the next use.
type lazyParty struct {
	provider    Provider
	redirectURI string
	client      *http.Client
	log         *slog.Logger

	mu    sync.Mutex
	party rp.RelyingParty
}

func (l *lazyParty) get(ctx context.Context) (rp.RelyingParty, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.party != nil {
		return l.party, nil
	}
	party, err := rp.NewRelyingPartyOIDC(ctx, l.provider.Issuer, l.provider.ClientID, l.provider.ClientSecret,
		l.redirectURI, l.provider.Scopes, rp.WithHTTPClient(l.client), rp.WithLogger(l.log))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrProviderUnreachable, l.provider.Issuer, err)
	}
	l.log.InfoContext(ctx, "discovered the OpenID provider", "issuer", l.provider.Issuer,
		"end_session", party.GetEndSessionEndpoint() != "")
	l.party = party
	return party, nil
}
