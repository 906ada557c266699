package fairshare

import (
	"context"
	"log/slog"
	"time"
)

// Holder is what a person may hold on this replica: the gateway's running
// requests, the chat's event streams.
type Holder interface {
	// People returns the people who hold anything now.
	People() []uint
	// EndPerson ends all that person holds and returns how many.
	EndPerson(person uint) int
}

// Withdrawals end what people whose access was withdrawn (an admin disabled
// them) still hold on this replica: at once for a person this replica
// disabled (Withdraw), and, for a person another replica disabled, at the
// next look (Run), every Every — the time another replica's cached copy
// of their keys lasts.
type Withdrawals struct {
	Holders []Holder
	// Disabled returns those of people whose access is withdrawn.
	Disabled func(ctx context.Context, people []uint) ([]uint, error)
	Every    time.Duration
	Log      *slog.Logger
}

// Withdraw ends everything person holds here, and returns how many things.
func (w *Withdrawals) Withdraw(person uint) int {
	n := 0
	for _, h := range w.Holders {
		n += h.EndPerson(person)
	}
	return n
}

// Run looks every Every, until ctx ends, for people holding anything here
// whose access was withdrawn elsewhere, and ends what they hold: one query
// of the people holding something, none when nobody does.
func (w *Withdrawals) Run(ctx context.Context) {
	t := time.NewTicker(w.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.sweep(ctx)
	}
}

func (w *Withdrawals) sweep(ctx context.Context) {
	seen := map[uint]bool{}
	var people []uint
	for _, h := range w.Holders {
		for _, p := range h.People() {
			if !seen[p] {
				seen[p] = true
				people = append(people, p)
			}
		}
	}
	if len(people) == 0 {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, w.Every)
	defer cancel()
	disabled, err := w.Disabled(qctx, people)
	if err != nil {
		w.Log.Warn("look for disabled people holding requests or streams", "err", err)
		return
	}
	for _, p := range disabled {
		if n := w.Withdraw(p); n > 0 {
			w.Log.Info("ended what a disabled person held", "user", p, "ended", n)
		}
	}
}
