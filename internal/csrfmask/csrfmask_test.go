package csrfmask

import (
	"strings"
	"testing"
)

func TestMaskRoundTripsAndDiffers(t *testing.T) {
	token := "k3Jp0Qm-9xYzA1b2C3d4E5f6G7h8I9j0"
	a, b := Mask(token), Mask(token)
	if a == b || strings.Contains(a, token) || !strings.HasPrefix(a, prefix) {
		t.Fatalf("masks %q and %q of %q", a, b, token)
	}
	if Unmask(a) != token || Unmask(b) != token {
		t.Fatalf("unmasked %q / %q", Unmask(a), Unmask(b))
	}
	if Unmask(token) != token {
		t.Fatal("a raw token is not taken as it is")
	}
	for _, bad := range []string{"m.", "m.!!!", "m.YQ", "m." + strings.Repeat("A", 600)} {
		if got := Unmask(bad); got != "" {
			t.Errorf("Unmask(%.20q) = %q, want nothing", bad, got)
		}
	}
	if Mask("") != "" {
		t.Error("an empty token masked")
	}
}

func FuzzUnmask(f *testing.F) {
	f.Add(Mask("token"))
	f.Add("m.AAAA")
	f.Add("raw-token")
	f.Fuzz(func(t *testing.T, v string) {
		got := Unmask(v)
		if len(got) > maxLen {
			t.Fatalf("unmasked %d bytes", len(got))
		}
		if !strings.HasPrefix(v, prefix) && got != v {
			t.Fatalf("raw %q changed to %q", v, got)
		}
	})
}
