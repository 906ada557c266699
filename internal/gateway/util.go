package gateway

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"net/http"

	"github.com/tidwall/gjson"

	"moonji/internal/proxy"
)

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// newID returns "inf_" and 26 characters of crypto-random base32 (128 bits).
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on Linux
	return "inf_" + idEncoding.EncodeToString(b[:])
}

// ErrorBody formats an error in OpenAI's shape:
// {"error":{"message","type","param","code"}}.
func ErrorBody(message, typ, code string) []byte {
	type inner struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	e := inner{Message: message, Type: typ}
	if code != "" {
		e.Code = &code
	}
	b, _ := json.Marshal(map[string]inner{"error": e})
	return b
}

func errorResponse(status int, message, typ, code string, hdr http.Header) *Response {
	return &Response{Status: status, ContentType: "application/json", Header: hdr, Body: ErrorBody(message, typ, code)}
}

// usageOf reads the usage object of a whole (non-streamed) completion.
func usageOf(body []byte) (proxy.Usage, bool) {
	u := gjson.GetBytes(body, "usage")
	if !u.IsObject() {
		return proxy.Usage{}, false
	}
	return proxy.Usage{PromptTokens: int(u.Get("prompt_tokens").Int()), CompletionTokens: int(u.Get("completion_tokens").Int())}, true
}
