// Package csrfmask hides a session's CSRF token differently in every page
// that carries it. Pages are served compressed, and a compressed page that
// holds both a secret and text an attacker chose (a search echoed back)
// leaks the secret through its size, guess by guess (BREACH). Masked with a
// fresh random pad at each rendering, the token is never the same bytes
// twice, so there is nothing to guess; the check unmasks it.
package csrfmask

import (
	"crypto/rand"
	"encoding/base64"
	"strings"
)

// prefix marks a masked token; a raw one (scripts that read /api/me) never
// starts with it.
const prefix = "m."

// maxLen bounds what Unmask decodes: a token is a few dozen bytes.
const maxLen = 512

// Mask returns token XOR a random pad, with the pad: "m." and base64 of
// pad‖masked. Each call gives other bytes.
func Mask(token string) string {
	if token == "" {
		return ""
	}
	n := len(token)
	buf := make([]byte, 2*n)
	_, _ = rand.Read(buf[:n]) // crypto/rand never fails on Linux
	for i := range n {
		buf[n+i] = token[i] ^ buf[i]
	}
	return prefix + base64.RawURLEncoding.EncodeToString(buf)
}

// Unmask returns the token a value carries: unmasked if Mask made it, as it
// is otherwise. A value that looks masked but does not decode gives "".
func Unmask(v string) string {
	rest, ok := strings.CutPrefix(v, prefix)
	if !ok {
		return v
	}
	if len(rest) > maxLen {
		return ""
	}
	buf, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || len(buf) == 0 || len(buf)%2 != 0 {
		return ""
	}
	n := len(buf) / 2
	out := make([]byte, n)
	for i := range n {
		out[i] = buf[i] ^ buf[n+i]
	}
	return string(out)
}
