package assets

import (
	"strconv"
	"strings"
)

// Bounds on an Accept-Encoding header, which a stranger writes: browsers
// send a handful of codings in a few dozen bytes.
const (
	maxAcceptLen    = 1024
	maxAcceptCoding = 32
)

// Negotiate picks the encoding of a response from the request's
// Accept-Encoding: "br", "gzip", or "" (as it is). It honours q-values
// (q=0 refuses a coding) and "*"; of two equally welcome, br wins, being
// smaller. A malformed entry counts as a refusal, never as a wish.
func Negotiate(acceptEncoding string) string {
	br, gz := weights(acceptEncoding)
	switch {
	case br > 0 && br >= gz:
		return "br"
	case gz > 0:
		return "gzip"
	}
	return ""
}

// accepts says whether coding ("br" or "gzip") is welcome at all.
func accepts(acceptEncoding, coding string) bool {
	br, gz := weights(acceptEncoding)
	if coding == "br" {
		return br > 0
	}
	return gz > 0
}

// weights are the q-values of br and gzip in an Accept-Encoding header, 0
// for a coding it does not welcome.
func weights(h string) (br, gz float64) {
	if len(h) > maxAcceptLen {
		h = h[:maxAcceptLen]
	}
	star := -1.0
	brSet, gzSet := false, false
	for i, part := range strings.Split(h, ",") {
		if i == maxAcceptCoding {
			break
		}
		name, params, _ := strings.Cut(part, ";")
		name = strings.ToLower(strings.TrimSpace(name))
		q, ok := qValue(params)
		if !ok {
			q = 0
		}
		switch name {
		case "br":
			br, brSet = q, true
		case "gzip", "x-gzip":
			gz, gzSet = q, true
		case "*":
			star = q
		}
	}
	if star >= 0 {
		if !brSet {
			br = star
		}
		if !gzSet {
			gz = star
		}
	}
	return br, gz
}

// qValue reads the q parameter of one coding's parameters ("q=0.5"); no q
// means 1. ok is false for a malformed or out-of-range one.
func qValue(params string) (float64, bool) {
	q := 1.0
	for _, p := range strings.Split(params, ";") {
		k, v, found := strings.Cut(p, "=")
		if strings.TrimSpace(p) == "" {
			continue
		}
		if !found {
			return 0, false
		}
		if !strings.EqualFold(strings.TrimSpace(k), "q") {
			continue // an extension parameter: ignored
		}
		v = strings.TrimSpace(v)
		// RFC 9110: qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )
		if len(v) == 0 || len(v) > 5 || (v[0] != '0' && v[0] != '1') {
			return 0, false
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			return 0, false
		}
		q = f
	}
	return q, true
}
