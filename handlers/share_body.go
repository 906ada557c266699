package handlers

import (
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/jsonguard"
	"moonji/internal/share"
)

// shareWatch lists the fields a new share link's body reads.
var shareWatch = jsonguard.Watch{{Name: "expires_in"}, {Name: "show_author"}}

// parseShareBody reads POST /api/v1/conversations/{id}/shares's body,
// {"expires_in", "show_author"}, each optional (an empty body is no
// option at all): expires_in is whole seconds, or a Go duration string
// ("24h"), from share.MinExpiry to share.MaxExpiry (null or absent: the
// link lasts until revoked); show_author a boolean.
func parseShareBody(body []byte) (share.Request, error) {
	var r share.Request
	if len(strings.TrimSpace(string(body))) == 0 {
		return r, nil
	}
	root, err := guardedObject(body, shareWatch)
	if err != nil {
		return r, err
	}
	bad := &bodyError{Message: share.ErrBadExpiry.Error() + `, or a duration such as "24h"`, Param: "expires_in"}
	switch v := root.Get("expires_in"); v.Type {
	case gjson.Null: // absent too
	case gjson.Number:
		n, ok := wholeNumber(v)
		if !ok || n > int(share.MaxExpiry/time.Second) {
			return r, bad
		}
		r.ExpiresIn = time.Duration(n) * time.Second
		if r.ExpiresIn == 0 || share.CheckExpiry(r.ExpiresIn) != nil {
			return r, bad
		}
	case gjson.String:
		// A Go duration ("90m", "720h"); a number of seconds in a string
		// ("3600") is read as one too, as forms send it.
		d, err := time.ParseDuration(v.Str)
		if err != nil {
			n, nerr := strconv.ParseInt(v.Str, 10, 64)
			if nerr != nil || n < 0 || n > int64(share.MaxExpiry/time.Second) {
				return r, bad
			}
			d = time.Duration(n) * time.Second
		}
		if d == 0 || share.CheckExpiry(d) != nil {
			return r, bad
		}
		r.ExpiresIn = d
	default:
		return r, bad
	}
	switch v := root.Get("show_author"); v.Type {
	case gjson.Null:
	case gjson.True:
		r.ShowAuthor = true
	case gjson.False:
	default:
		return r, &bodyError{Message: "show_author must be true or false", Param: "show_author"}
	}
	return r, nil
}
