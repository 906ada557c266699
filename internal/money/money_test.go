package money

import (
	"math"
	"testing"
)

func TestCost(t *testing.T) {
	p := Price{Input: 150_000_000, Output: 600_000_000, CachedInput: 75_000_000} // 0.15 / 0.60 / 0.075 per M
	for _, tc := range []struct {
		name string
		tok  Tokens
		want Amount
	}{
		{"nothing", Tokens{}, 0},
		{"one input token", Tokens{Prompt: 1}, 150},
		{"million each way", Tokens{Prompt: 1_000_000, Completion: 1_000_000}, 750_000_000},
		{"cached at its price", Tokens{Prompt: 1000, Cached: 400, Completion: 10}, 600*150 + 400*75 + 10*600},
		{"cached above prompt is prompt", Tokens{Prompt: 10, Cached: 99}, 10 * 75},
		{"negative is nothing", Tokens{Prompt: -5, Completion: -7}, 0},
		{"huge saturates", Tokens{Prompt: math.MaxInt64, Completion: math.MaxInt64}, math.MaxInt64},
	} {
		if got := Cost(p, tc.tok); got != tc.want {
			t.Errorf("%s: Cost = %d, want %d", tc.name, got, tc.want)
		}
	}
	// Rounded up: a third of a nano-unit is one.
	if got := Cost(Price{Input: 1_000_000 / 3}, Tokens{Prompt: 1}); got != 1 {
		t.Errorf("fraction: %d, want 1", got)
	}
	if got := Cost(Price{Input: 100}, Tokens{Prompt: 1, Cached: 1}); got != 1 {
		t.Errorf("cached without its own price bills as input: %d", got)
	}
	if got := Cost(Price{}, Tokens{Prompt: 1 << 40, Completion: 1 << 40}); got != 0 {
		t.Errorf("free model: %d", got)
	}
}

func TestParseAndFormat(t *testing.T) {
	for in, want := range map[string]Amount{"5": 5 * Nano, "5.00": 5 * Nano, "0.5": Nano / 2, ".25": Nano / 4,
		"0.000000001": 1, "1.000123": 1_000_123_000} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", ".", "-1", "+1", "1e3", "0.0000000001", "abc", "1.2.3", "99999999999999999999", "NaN"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	for n, want := range map[Amount]string{0: "0.000000", 1: "0.000000001", 150: "0.00000015", 123_000: "0.000123",
		5 * Nano: "5.000000", -150: "-0.00000015", 1_234_567_891: "1.234567891"} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
	}
	for n, want := range map[Amount]string{0: "0", 18_000: "0.000018", 5 * Nano: "5.00", 1_234_567_891: "1.23",
		24_999_915_000: "24.99", -1_999_000_000: "-1.99"} {
		if got := FormatShort(n); got != want {
			t.Errorf("FormatShort(%d) = %q, want %q", n, got, want)
		}
	}
	for v, want := range map[float64]Amount{0.15: 150_000_000, 0.075: 75_000_000, 2.5: 2_500_000_000, 0: 0} {
		if got, err := FromFloat(v, MaxPrice); err != nil || got != want {
			t.Errorf("FromFloat(%v) = %d, %v", v, got, err)
		}
	}
	for _, bad := range []float64{-0.1, math.NaN(), math.Inf(1), 2e6, 1e-10} {
		if _, err := FromFloat(bad, MaxPrice); err == nil {
			t.Errorf("FromFloat(%v) accepted", bad)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"5", "0.000000001", "1.5", ".5", "18446744073709551615"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("Parse(%q) = %d < 0", s, n)
		}
		back, err := Parse(Format(n))
		if err != nil || back != n {
			t.Fatalf("Format(%d) = %q reads back as %d, %v", n, Format(n), back, err)
		}
	})
}
