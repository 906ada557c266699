// Package money is Moonji's arithmetic of prices and costs: amounts are
// whole nano-units of the deployment's currency (10⁻⁹ USD, say) in an
// int64, so that a cost summed over millions of rows never drifts the way
// floats do, and one token of the cheapest model still costs a whole
// number of units (0.01 per million tokens is 10 nano-units a token).
// The largest amount, ~9.2 × 10⁹ currency units, is far above any budget.
package money

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// Nano is the number of units in one currency unit.
const Nano = 1_000_000_000

// Amount is an amount of money in nano-units of the currency.
type Amount = int64

// MaxPrice bounds a price per million tokens (in currency units): a bigger
// one is a typo, and the bound keeps Cost's products inside 128 bits.
const MaxPrice = 1_000_000

// Price is a model's price in nano-units per million tokens. The zero Price
// is a free model.
type Price struct {
	Input       Amount
	Output      Amount
	CachedInput Amount
}

// Free reports whether every token of the model costs nothing.
func (p Price) Free() bool { return p.Input == 0 && p.Output == 0 && p.CachedInput == 0 }

// Tokens are what one request was billed for.
type Tokens struct {
	Prompt     int64 // every input token, cached ones included
	Cached     int64 // of Prompt, those the engine served from its cache
	Completion int64
}

// Cost is what tokens cost at price, rounded up to a whole nano-unit (a
// request is never free because it was small). Cached tokens are billed at
// CachedInput; a model without a cached price bills them as input. Negative
// counts count as 0 and Cached is at most Prompt: a row's tokens are
// already checked, this keeps the arithmetic safe whatever it is given.
func Cost(price Price, t Tokens) Amount {
	prompt, cached, completion := max(t.Prompt, 0), max(t.Cached, 0), max(t.Completion, 0)
	cached = min(cached, prompt)
	cachedPrice := price.CachedInput
	if cachedPrice == 0 {
		cachedPrice = price.Input
	}
	// Σ tokens × nano-units per million tokens, in 128 bits, then one
	// division by a million rounded up.
	var hi, lo uint64
	add := func(n int64, p Amount) {
		if n <= 0 || p <= 0 {
			return
		}
		h, l := bits.Mul64(uint64(n), uint64(p))
		var c uint64
		lo, c = bits.Add64(lo, l, 0)
		hi += h + c
	}
	add(prompt-cached, price.Input)
	add(cached, cachedPrice)
	add(completion, price.Output)
	if hi >= 1_000_000 {
		return math.MaxInt64 // beyond any budget; Div64 would panic
	}
	q, r := bits.Div64(hi, lo, 1_000_000)
	if r > 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return Amount(q)
}

// ErrAmount is returned for an amount that is not a plain decimal number.
var ErrAmount = errors.New("not an amount")

// Parse reads a decimal amount in currency units ("5", "0.50", "1e-3" is
// refused) into nano-units. At most nine decimals; negative is refused.
func Parse(s string) (Amount, error) {
	s = strings.TrimSpace(s)
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" && frac == "" || len(frac) > 9 || strings.HasPrefix(whole, "+") || strings.HasPrefix(whole, "-") {
		return 0, fmt.Errorf("%w: %q (a decimal number ≥ 0 with at most 9 decimals)", ErrAmount, s)
	}
	if whole == "" {
		whole = "0"
	}
	w, err := strconv.ParseUint(whole, 10, 64)
	if err != nil || w > math.MaxInt64/Nano-1 {
		return 0, fmt.Errorf("%w: %q", ErrAmount, s)
	}
	var f uint64
	if frac != "" {
		f, err = strconv.ParseUint(frac+strings.Repeat("0", 9-len(frac)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: %q", ErrAmount, s)
		}
	}
	return Amount(w*Nano + f), nil
}

// FromFloat converts a price or amount written as a YAML number into
// nano-units, by its shortest decimal form: what is negative, not finite,
// above limit or more precise than a nano-unit is refused.
func FromFloat(v, limit float64) (Amount, error) {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > limit {
		return 0, fmt.Errorf("%w: %v (between 0 and %v)", ErrAmount, v, limit)
	}
	return Parse(strconv.FormatFloat(v, 'f', -1, 64))
}

// Format writes an amount in currency units with at least six decimals and
// no more than it needs (1 → "0.000000001", 150 → "0.00000015", 5×10⁹ →
// "5.000000"): exact, and what the export's cost column holds.
func Format(n Amount) string {
	sign := ""
	if n < 0 {
		sign, n = "-", -n
	}
	s := fmt.Sprintf("%d.%09d", n/Nano, n%Nano)
	trimmed := strings.TrimRight(s, "0")
	if keep := len(s) - 3; len(trimmed) < keep {
		trimmed = s[:keep]
	}
	return sign + trimmed
}

// FormatShort writes an amount for people: two decimals from one unit up,
// cut rather than rounded (what is left of a budget never shows more than
// there is), else exactly, without trailing zeros ("0.000018"), and "0"
// for nothing.
func FormatShort(n Amount) string {
	if n == 0 {
		return "0"
	}
	if n >= Nano || n <= -Nano {
		sign := ""
		if n < 0 {
			sign, n = "-", -n
		}
		return fmt.Sprintf("%s%d.%02d", sign, n/Nano, n%Nano/(Nano/100))
	}
	return strings.TrimRight(Format(n), "0")
}
