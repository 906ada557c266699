// Package clientip decides which address a request comes from, for limits
// per address and for logs. The TCP peer is the client unless it is a proxy
// the operator trusts; only then does X-Forwarded-For count, and only as far
// as the chain of trusted proxies goes: anyone can write the header, so the
// entries to the left of the first untrusted hop are the client's own claims.
// It knows nothing of Fiber: callers pass the peer and the header values.
package clientip

import (
	"fmt"
	"net/netip"
	"strings"
)

// ParsePrefixes reads trusted proxies as CIDRs ("10.0.0.0/8") or single
// addresses ("10.0.0.1", a /32 or /128), as configured in trusted_proxies.
func ParsePrefixes(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, unmapPrefix(p).Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("trusted proxy: want a CIDR such as 10.0.0.0/8 or an address, got %q", s)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// unmapPrefix turns ::ffff:10.0.0.0/104 into 10.0.0.0/8, so that a prefix
// written either way matches the unmapped addresses Client compares.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	a := p.Addr()
	if !a.Is4In6() {
		return p
	}
	bits := p.Bits() - 96
	if bits < 0 {
		bits = 0
	}
	return netip.PrefixFrom(a.Unmap(), bits)
}

// Client returns the client's address: peer, unless peer is a trusted
// proxy. Then X-Forwarded-For (all its values, in the order received, as one
// comma-separated list) is walked from the right — the hop nearest to us —
// skipping trusted proxies, and the first untrusted address is the client.
// A malformed entry ends the walk: what lies to its left cannot be trusted,
// so the last trusted hop is taken. When every hop is trusted, the leftmost
// one is.
func Client(peer netip.Addr, forwardedFor []string, trusted []netip.Prefix) netip.Addr {
	peer = peer.Unmap().WithZone("")
	if !isTrusted(peer, trusted) {
		return peer
	}
	last := peer
	for i := len(forwardedFor) - 1; i >= 0; i-- {
		entries := strings.Split(forwardedFor[i], ",")
		for j := len(entries) - 1; j >= 0; j-- {
			e := strings.TrimSpace(entries[j])
			if e == "" && len(entries) > 1 {
				continue // "a, , b" or a trailing comma: an empty list element (RFC 9110 5.6.1)
			}
			a, ok := parseEntry(e)
			if !ok {
				return last
			}
			if !isTrusted(a, trusted) {
				return a
			}
			last = a
		}
	}
	return last
}

// parseEntry reads one X-Forwarded-For element: an address, or an address
// with a port ("203.0.113.7:4711", "[2001:db8::1]:4711"), as some proxies
// write it.
func parseEntry(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Addr().Zone() == "" {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Bucket is the key a limit per address counts under: the address itself
// for IPv4, its /64 for IPv6, because one IPv6 host usually holds a whole
// /64 and could otherwise start afresh with each of its addresses.
func Bucket(a netip.Addr) string {
	a = a.Unmap()
	if a.Is6() {
		return netip.PrefixFrom(a.WithZone(""), 64).Masked().String()
	}
	return a.String()
}
