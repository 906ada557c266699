// Package spending decides what a request's sender may use and spend: the
// budgets that apply to it (its key's, its person's, each of its person's
// teams') and the models it may use (every list of its key and teams holds
// at once). Policies are read from the database and kept 5 seconds per key
// or person, as keys are (apikey.Store): a change made on this replica is
// seen at once (Forget), one made on another replica within 5 s. What was
// spent is never cached here; budget.Store keeps it in Redis. While the
// database fails, a policy read within StaleIfError is used again
// (stale-if-error, as apikey does), one read attempt a second per sender.
package spending

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"gorm.io/gorm"

	"moonji/internal/budget"
	"moonji/models"
)

// Policy is what one sender may use and spend.
type Policy struct {
	// Limits are the budgets the sender's requests are checked against.
	Limits []budget.Limit
	// models, when not nil, are the only models the sender may use.
	models map[string]bool
}

// Allows reports whether the sender may use model.
func (p Policy) Allows(model string) bool { return p.models == nil || p.models[model] }

// Restricted reports whether some model list applies.
func (p Policy) Restricted() bool { return p.models != nil }

// ttl is how long a policy is kept.
const ttl = 5 * time.Second

// StaleIfError is how old a policy may be and still be used while the
// database fails to read it again (apikey.StaleIfError, the same).
const StaleIfError = 10 * time.Minute

type cacheKey struct{ user, key uint }

type entry struct {
	policy Policy
	at     time.Time
	failed time.Time // the last read that failed, after at
}

// Resolver reads and caches policies.
type Resolver struct {
	db  *gorm.DB
	now func() time.Time
	// loads makes the requests that miss the cache for one sender at the
	// same time share one read (a burst of a cold key's requests is one
	// read, not hundreds at once).
	loads singleflight.Group

	mu    sync.Mutex
	cache map[cacheKey]entry
}

// NewResolver returns a Resolver reading db.
func NewResolver(db *gorm.DB) *Resolver {
	return &Resolver{db: db, now: time.Now, cache: map[cacheKey]entry{}}
}

// maxCached bounds the cache; past it, expired entries are dropped, and
// with none expired everything is (it refills in 5 s).
const maxCached = 100_000

// For returns the policy of person user sending with key (nil: their web
// session).
func (r *Resolver) For(ctx context.Context, user uint, key *uint) (Policy, error) {
	k := cacheKey{user: user}
	if key != nil {
		k.key = *key
	}
	now := r.now()
	r.mu.Lock()
	e, ok := r.cache[k]
	r.mu.Unlock()
	if ok && now.Sub(e.at) < ttl {
		return e.policy, nil
	}
	stale := ok && now.Sub(e.at) < ttl+StaleIfError
	if stale && now.Sub(e.failed) < time.Second {
		return e.policy, nil // the database failed a moment ago
	}
	v, err, _ := r.loads.Do(fmt.Sprintf("%d/%d", k.user, k.key), func() (any, error) {
		// Not the first caller's context: its end must not fail the others.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		return r.load(ctx, user, key)
	})
	if err != nil {
		if stale {
			r.mu.Lock()
			if e, ok := r.cache[k]; ok {
				e.failed = now
				r.cache[k] = e
			}
			r.mu.Unlock()
			return e.policy, nil
		}
		return Policy{}, err
	}
	p := v.(Policy)
	r.mu.Lock()
	if len(r.cache) >= maxCached {
		for ck, ce := range r.cache {
			if now.Sub(ce.at) >= ttl+StaleIfError {
				delete(r.cache, ck)
			}
		}
		if len(r.cache) >= maxCached {
			clear(r.cache)
		}
	}
	r.cache[k] = entry{policy: p, at: now}
	r.mu.Unlock()
	return p, nil
}

// Forget drops every cached policy, after a budget, a model list or a team
// changed on this replica.
func (r *Resolver) Forget() {
	r.mu.Lock()
	clear(r.cache)
	r.mu.Unlock()
}

func (r *Resolver) load(ctx context.Context, user uint, key *uint) (Policy, error) {
	var p Policy
	db := r.db.WithContext(ctx)
	if key != nil {
		var k models.APIKey
		if err := db.Select("id", "name", "budget", "budget_period", "models").Where("id = ?", *key).Take(&k).Error; err != nil {
			return Policy{}, fmt.Errorf("read key %d's budget: %w", *key, err)
		}
		if err := p.add(budget.ScopeKey, k.ID, k.Name, k.Budget, k.BudgetPeriod, k.Models); err != nil {
			return Policy{}, err
		}
	}
	if user == 0 {
		return p, nil
	}
	var u models.User
	if err := db.Select("id", "email", "budget", "budget_period").Where("id = ?", user).Take(&u).Error; err != nil {
		return Policy{}, fmt.Errorf("read person %d's budget: %w", user, err)
	}
	if err := p.add(budget.ScopePerson, u.ID, u.Email, u.Budget, u.BudgetPeriod, ""); err != nil {
		return Policy{}, err
	}
	teams, err := models.TeamsOf(ctx, r.db, user)
	if err != nil {
		return Policy{}, err
	}
	for _, t := range teams {
		if err := p.add(budget.ScopeTeam, t.ID, t.Name, t.Budget, t.BudgetPeriod, t.Models); err != nil {
			return Policy{}, err
		}
	}
	return p, nil
}

// LimitOf is a stored budget (amount nil: none) as budget.Store takes it;
// ok is false without one. A stored period is checked when it is set; one
// that is not known counts as total, which limits the most, never the
// least.
func LimitOf(scope budget.Scope, id uint, name string, amount *int64, period string) (l budget.Limit, ok bool) {
	if amount == nil {
		return budget.Limit{}, false
	}
	per, err := budget.ParsePeriod(period)
	if err != nil {
		per = budget.PeriodTotal
	}
	return budget.Limit{Scope: scope, ID: id, Name: name, Amount: *amount, Period: per}, true
}

// add takes one scope's budget and model list into the policy.
func (p *Policy) add(scope budget.Scope, id uint, name string, amount *int64, period, list string) error {
	if l, ok := LimitOf(scope, id, name, amount, period); ok {
		p.Limits = append(p.Limits, l)
	}
	if strings.TrimSpace(list) == "" {
		return nil
	}
	names, err := models.ParseModelList(list)
	if err != nil {
		// A list that cannot be read allows nothing rather than everything.
		names = nil
	}
	allowed := map[string]bool{}
	for _, n := range names {
		if p.models == nil || p.models[n] {
			allowed[n] = true
		}
	}
	p.models = allowed
	return nil
}
