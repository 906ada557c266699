package gateway

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"moonji/internal/proxy"
	"moonji/internal/responses"
)

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// newID returns "inf_" and 26 characters of base32: 48 bits of the time in
// milliseconds, then 80 crypto-random bits (a ULID's layout). Ids made later
// sort after earlier ones, so the ledger's unique index on them grows at its
// right edge: a batch of rows touches one leaf page of it, not one page per
// row, as random ids did (the SQLite writer's largest cost per row after
// parsing). 80 random bits per millisecond keep ids unguessable and unique.
func newID() string {
	var b [16]byte
	ms := uint64(time.Now().UnixMilli())
	for i := 5; i >= 0; i-- {
		b[i] = byte(ms)
		ms >>= 8
	}
	_, _ = rand.Read(b[6:]) // crypto/rand never fails on Linux
	return "inf_" + idEncoding.EncodeToString(b[:])
}

// ErrorBody formats an error in OpenAI's shape:
// {"error":{"message","type","param","code"}}.
func ErrorBody(message, typ, code string) []byte {
	return apiError{message: message, typ: typ, code: code}.body()
}

// ErrorBodyParam is ErrorBody with param naming the request field at fault
// (null when param is "").
func ErrorBodyParam(message, typ, code, param string) []byte {
	return apiError{message: message, typ: typ, code: code, param: param}.body()
}

// apiError is an error in OpenAI's shape; param names the request field at
// fault, when the gateway knows it.
type apiError struct {
	message, typ, code, param string
}

// badRequest turns a body the gateway cannot read into a 400's error.
func badRequest(err error) apiError {
	e := apiError{message: err.Error(), typ: "invalid_request_error", code: "invalid_request"}
	var bre *proxy.BadRequestError
	if errors.As(err, &bre) {
		e.param = bre.Param
	}
	return e
}

func (e apiError) body() []byte {
	type inner struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	in := inner{Message: e.message, Type: e.typ}
	if e.code != "" {
		in.Code = &e.code
	}
	if e.param != "" {
		in.Param = &e.param
	}
	b, _ := json.Marshal(map[string]inner{"error": in})
	return b
}

func (e apiError) response(status int, hdr http.Header) *Response {
	return &Response{Status: status, ContentType: "application/json", Header: hdr, Body: e.body()}
}

func errorResponse(status int, message, typ, code string, hdr http.Header) *Response {
	return apiError{message: message, typ: typ, code: code}.response(status, hdr)
}

// refusal makes a translation's refusal a client error naming its field.
func refusal(err error) error {
	var r *responses.Refusal
	if errors.As(err, &r) {
		return &proxy.BadRequestError{Message: r.Message, Param: r.Param}
	}
	return err
}
