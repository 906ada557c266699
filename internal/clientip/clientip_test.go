package clientip

import (
	"net/netip"
	"testing"
)

func TestClient(t *testing.T) {
	trusted, err := ParsePrefixes([]string{"10.0.0.0/8", "192.0.2.1", "2001:db8:1::/48", "::ffff:172.16.0.0/108"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		peer string
		xff  []string
		want string
	}{
		{"untrusted peer: header ignored", "203.0.113.9", []string{"198.51.100.1"}, "203.0.113.9"},
		{"untrusted peer, no header", "203.0.113.9", nil, "203.0.113.9"},
		{"trusted peer names the client", "10.1.2.3", []string{"198.51.100.1"}, "198.51.100.1"},
		{"trusted peer without header", "10.1.2.3", nil, "10.1.2.3"},
		{"client's own claims to the left are ignored", "10.1.2.3", []string{"1.1.1.1, 198.51.100.1"}, "198.51.100.1"},
		{"a chain of trusted proxies is skipped", "10.1.2.3", []string{"1.1.1.1, 198.51.100.1, 10.9.9.9, 192.0.2.1"}, "198.51.100.1"},
		{"several header lines are one list", "10.1.2.3", []string{"1.1.1.1, 198.51.100.1", "10.9.9.9"}, "198.51.100.1"},
		{"every hop trusted: the leftmost", "10.1.2.3", []string{"10.7.7.7, 10.8.8.8"}, "10.7.7.7"},
		{"malformed entry: the last trusted hop", "10.1.2.3", []string{"198.51.100.1, garbage, 10.8.8.8"}, "10.8.8.8"},
		{"malformed right away: the peer", "10.1.2.3", []string{"1.1.1.1, not-an-ip"}, "10.1.2.3"},
		{"empty header: the peer", "10.1.2.3", []string{""}, "10.1.2.3"},
		{"empty list elements are skipped", "10.1.2.3", []string{"198.51.100.1, ,10.8.8.8,"}, "198.51.100.1"},
		{"ports are tolerated", "10.1.2.3", []string{"198.51.100.1:4711"}, "198.51.100.1"},
		{"IPv6 with a port", "10.1.2.3", []string{"[2001:db8:2::1]:4711"}, "2001:db8:2::1"},
		{"a zone is malformed", "10.1.2.3", []string{"fe80::1%eth0"}, "10.1.2.3"},
		{"IPv6 trusted proxy", "2001:db8:1::5", []string{"2001:db8:2::1"}, "2001:db8:2::1"},
		{"4-in-6 peer matches an IPv4 prefix", "::ffff:10.1.2.3", []string{"198.51.100.1"}, "198.51.100.1"},
		{"4-in-6 prefix matches an IPv4 peer", "172.16.0.1", []string{"198.51.100.1"}, "198.51.100.1"},
		{"4-in-6 entries are unmapped", "10.1.2.3", []string{"::ffff:198.51.100.1"}, "198.51.100.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Client(netip.MustParseAddr(tc.peer), tc.xff, trusted)
			if got.String() != tc.want {
				t.Errorf("Client(%s, %q) = %s, want %s", tc.peer, tc.xff, got, tc.want)
			}
		})
	}
	// Without trusted proxies the header never counts.
	if got := Client(netip.MustParseAddr("10.1.2.3"), []string{"198.51.100.1"}, nil); got.String() != "10.1.2.3" {
		t.Errorf("no trusted proxies: %s", got)
	}
}

func TestParsePrefixes(t *testing.T) {
	if _, err := ParsePrefixes([]string{"10.0.0.0/8", "::1", " 192.0.2.1 "}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "10.0.0.0/33", "example.com", "10.0.0.1/8/8", "fe80::1%eth0"} {
		if _, err := ParsePrefixes([]string{bad}); err == nil {
			t.Errorf("ParsePrefixes(%q) accepted", bad)
		}
	}
}

func TestBucket(t *testing.T) {
	for in, want := range map[string]string{
		"198.51.100.1":           "198.51.100.1",
		"::ffff:198.51.100.1":    "198.51.100.1",
		"2001:db8:1:2:3:4:5:6":   "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::abc": "2001:db8:1:2::/64",
	} {
		if got := Bucket(netip.MustParseAddr(in)); got != want {
			t.Errorf("Bucket(%s) = %s, want %s", in, got, want)
		}
	}
}
