// Package protocol is the message contract between a Moonji gateway and a
// `moonji engine`: one WebSocket per gateway replica carries the messages of
// many sessions, each an Envelope (docs/engine-protocol.md, and its JSON
// Schema docs/engine-protocol.schema.json, which a test keeps in step with
// Decode).
//
// Every message, both ways, names its protocol version, its own id, its type
// and — for everything that belongs to a session — the session. A reply
// whose session the receiver does not know is dropped, never delivered
// elsewhere: one person's answer reaching another is a data leak, not a
// glitch. An envelope that fails validation is answered with an `error`
// envelope naming its id, and changes nothing else on the connection.
//
// The versions are negotiated before the first envelope, in the WebSocket
// handshake: the gateway offers Subprotocol(Version) and the engine accepts
// it or refuses the upgrade with a sentence naming the versions it speaks.
package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"moonji/internal/jsonguard"
)

// Version is the protocol's major version: envelopes carry it in `v`, and a
// peer refuses a major version it does not speak.
const Version = 1

// Subprotocol is the WebSocket subprotocol name of major version v.
func Subprotocol(v int) string { return "moonji-engine.v" + strconv.Itoa(v) }

// ParseSubprotocol returns the major version a subprotocol name stands for.
func ParseSubprotocol(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "moonji-engine.v")
	if !ok || rest == "" || len(rest) > 4 {
		return 0, false
	}
	v, err := strconv.Atoi(rest)
	if err != nil || v <= 0 || strconv.Itoa(v) != rest {
		return 0, false
	}
	return v, true
}

// Message types.
const (
	TypeSessionOpen   = "session.open"   // gateway → engine: a session starts (model, settings)
	TypeChatRequest   = "chat.request"   // gateway → engine: an OpenAI chat body, untouched
	TypeChatResponse  = "chat.response"  // engine → gateway: a whole answer (not streamed, or an upstream error)
	TypeChatChunk     = "chat.chunk"     // engine → gateway: one SSE frame, byte for byte
	TypeChatDone      = "chat.done"      // engine → gateway: the answer ended (finish reason, usage)
	TypeChatError     = "chat.error"     // engine → gateway: the answer failed (status, message)
	TypeSessionCancel = "session.cancel" // gateway → engine: stop the session's request now
	TypeSessionClose  = "session.close"  // either way: the session is over; forget it
	TypeGoAway        = "goaway"         // engine → gateway: no new sessions here (restart)
	TypeError         = "error"          // either way: the envelope named by ref was refused
)

// Limits on what a peer may send.
const (
	// MaxIDLen bounds message and session ids.
	MaxIDLen = 64
	// MaxEnvelope bounds one envelope: a chat body of the gateway's largest
	// (max_body_bytes, 32 MiB) with room for the envelope around it.
	MaxEnvelope = 33 << 20
	// maxText bounds the short texts (reasons, messages, model names), in
	// characters as JSON Schema's maxLength counts them.
	maxText = 1024
)

// Envelope is one message. Payload holds the type's fields as raw JSON;
// Decode has checked them, and the typed accessors read them.
type Envelope struct {
	V       int             `json:"v"`
	ID      string          `json:"id"`
	Type    string          `json:"type"`
	Session string          `json:"session,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// The payloads, by type. Fields the gateway or the engine ignore may be
// added within a major version: receivers skip unknown fields.
type (
	// SessionOpen starts a session for a model, with settings the engine
	// keeps until the session closes.
	SessionOpen struct {
		Model    string            `json:"model"`
		Settings map[string]string `json:"settings,omitempty"`
	}
	// ChatRequest is an OpenAI chat-completions body, passed through as
	// the client wrote it (with the gateway's own patches: model,
	// stream_options), as a JSON string so that no byte changes.
	ChatRequest struct {
		Body string `json:"body"`
		// Traceparent is the W3C traceparent of the gateway's span for
		// this call (empty: not traced); the engine passes it to its
		// upstream, so that an engine that traces joins the trace.
		Traceparent string `json:"traceparent,omitempty"`
	}
	// ChatResponse is the upstream's whole answer when it was not an event
	// stream: a non-streamed completion, or an error answer, relayed to the
	// client with its status and body as they were. A streamed answer is
	// a ChatResponse with Stream set and no body, then chunks, then
	// chat.done.
	ChatResponse struct {
		Status      int    `json:"status"`
		ContentType string `json:"content_type,omitempty"`
		Stream      bool   `json:"stream,omitempty"`
		Body        string `json:"body,omitempty"`
	}
	// ChatChunk is one SSE frame as the engine's upstream wrote it,
	// "data: …\n\n" included: the gateway writes it to a /v1 client as it
	// is. Seq counts a session's chunks from 1, so a gap is seen.
	ChatChunk struct {
		Seq   int64  `json:"seq"`
		Frame string `json:"frame"`
	}
	// ChatDone ends a session's answer.
	ChatDone struct {
		FinishReason string `json:"finish_reason,omitempty"`
		Usage        *Usage `json:"usage,omitempty"`
	}
	// ChatError ends a session's answer with a failure, in the terms of an
	// HTTP answer from an engine.
	ChatError struct {
		Status  int    `json:"status"`
		Code    string `json:"code,omitempty"`
		Message string `json:"message"`
	}
	// SessionCancel asks the engine to cancel the session's request.
	SessionCancel struct {
		Reason string `json:"reason,omitempty"`
	}
	// GoAway tells the gateway to open no new sessions on this connection.
	GoAway struct {
		Reason string `json:"reason,omitempty"`
	}
	// Error refuses the envelope whose id is Ref.
	Error struct {
		Ref     string `json:"ref,omitempty"`
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	// Usage is the token count of an answer.
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	}
)

// Codes of Error envelopes.
const (
	CodeInvalid        = "invalid_envelope"    // not an envelope of this protocol
	CodeVersion        = "unsupported_version" // v is not the negotiated major version
	CodeUnknownSession = "unknown_session"     // no such session on this connection
	CodeTooLarge       = "too_large"           // over MaxEnvelope
)

// DecodeError is why an envelope was refused. ID is its id when it could be
// read, so that the `error` answer can name it.
type DecodeError struct {
	ID     string
	Code   string
	Reason string
}

func (e *DecodeError) Error() string {
	if e.ID == "" {
		return "engine protocol: " + e.Reason
	}
	return fmt.Sprintf("engine protocol: envelope %s: %s", e.ID, e.Reason)
}

// Reply is the `error` envelope that answers a refused one.
func (e *DecodeError) Reply(id string) Envelope {
	return mustEnvelope(id, TypeError, "", Error{Ref: e.ID, Code: e.Code, Message: e.Reason})
}

// sessionTypes are the types that belong to a session.
var sessionTypes = map[string]bool{
	TypeSessionOpen: true, TypeChatRequest: true, TypeChatResponse: true, TypeChatChunk: true, TypeChatDone: true,
	TypeChatError: true, TypeSessionCancel: true, TypeSessionClose: true,
}

// Decode reads and checks one envelope: bounded in size and depth, the
// version it must be, a known type, ids of the allowed shape, the session
// where the type needs one, and the type's payload fields. Whatever a peer
// sends, it returns an error, never a panic.
func Decode(data []byte) (Envelope, error) {
	var env Envelope
	if len(data) > MaxEnvelope {
		return env, &DecodeError{Code: CodeTooLarge, Reason: fmt.Sprintf("envelope of %d bytes, more than %d", len(data), MaxEnvelope)}
	}
	// Bounded in depth before encoding/json recurses into it.
	if err := jsonguard.Validate(data, nil); err != nil {
		return env, &DecodeError{Code: CodeInvalid, Reason: "not JSON: " + err.Error()}
	}
	if err := json.Unmarshal(data, &env); err != nil {
		return Envelope{}, &DecodeError{Code: CodeInvalid, Reason: "not an envelope: " + err.Error()}
	}
	if err := checkID("id", env.ID); err != nil {
		return Envelope{}, &DecodeError{Code: CodeInvalid, Reason: err.Error()}
	}
	bad := func(code, format string, args ...any) (Envelope, error) {
		return Envelope{}, &DecodeError{ID: env.ID, Code: code, Reason: fmt.Sprintf(format, args...)}
	}
	if env.V != Version {
		return bad(CodeVersion, "version %d; this peer speaks %d", env.V, Version)
	}
	switch {
	case sessionTypes[env.Type]:
		if err := checkID("session", env.Session); err != nil {
			return bad(CodeInvalid, "%s: %v", env.Type, err)
		}
	case env.Type == TypeGoAway || env.Type == TypeError:
		if env.Session != "" {
			if err := checkID("session", env.Session); err != nil {
				return bad(CodeInvalid, "%s: %v", env.Type, err)
			}
		}
	default:
		return bad(CodeInvalid, "unknown type %.64q", env.Type)
	}
	if err := checkPayload(&env); err != nil {
		return bad(CodeInvalid, "%s payload: %v", env.Type, err)
	}
	return env, nil
}

// checkID accepts 1 to MaxIDLen characters from [A-Za-z0-9._:-]: ids go
// into logs and maps, never anything that could be read as something else.
func checkID(what, id string) error {
	if id == "" {
		return fmt.Errorf("%s is missing", what)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("%s is longer than %d characters", what, MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return fmt.Errorf("%s has a character outside [A-Za-z0-9._:-]", what)
		}
	}
	return nil
}

func checkPayload(env *Envelope) error {
	need := func() error {
		if len(env.Payload) == 0 || string(env.Payload) == "null" {
			return errors.New("missing")
		}
		return nil
	}
	text := func(name, s string, required bool) error {
		if required && s == "" {
			return fmt.Errorf("%s is missing", name)
		}
		if utf8.RuneCountInString(s) > maxText {
			return fmt.Errorf("%s is longer than %d characters", name, maxText)
		}
		return nil
	}
	switch env.Type {
	case TypeSessionOpen:
		var p SessionOpen
		if err := decodePayload(env, &p, need); err != nil {
			return err
		}
		if len(p.Settings) > 64 {
			return errors.New("more than 64 settings")
		}
		return text("model", p.Model, true)
	case TypeChatRequest:
		var p ChatRequest
		if err := decodePayload(env, &p, need); err != nil {
			return err
		}
		if p.Body == "" {
			return errors.New("body is missing")
		}
		return nil
	case TypeChatResponse:
		var p ChatResponse
		if err := decodePayload(env, &p, need); err != nil {
			return err
		}
		if p.Status < 200 || p.Status > 599 {
			return errors.New("status must be 200 to 599")
		}
		if p.Stream && p.Body != "" {
			return errors.New("a streamed response has no body")
		}
		return text("content_type", p.ContentType, false)
	case TypeChatChunk:
		var p ChatChunk
		if err := decodePayload(env, &p, need); err != nil {
			return err
		}
		if p.Seq < 1 {
			return errors.New("seq must be 1 or more")
		}
		if p.Frame == "" {
			return errors.New("frame is missing")
		}
		return nil
	case TypeChatDone:
		var p ChatDone
		if err := decodePayload(env, &p, nil); err != nil {
			return err
		}
		if p.Usage != nil && (p.Usage.PromptTokens < 0 || p.Usage.CompletionTokens < 0) {
			return errors.New("usage must not be negative")
		}
		return text("finish_reason", p.FinishReason, false)
	case TypeChatError:
		var p ChatError
		if err := decodePayload(env, &p, need); err != nil {
			return err
		}
		if p.Status < 400 || p.Status > 599 {
			return errors.New("status must be 400 to 599")
		}
		return errors.Join(text("code", p.Code, false), text("message", p.Message, true))
	case TypeSessionCancel:
		var p SessionCancel
		if err := decodePayload(env, &p, nil); err != nil {
			return err
		}
		return text("reason", p.Reason, false)
	case TypeGoAway:
		var p GoAway
		if err := decodePayload(env, &p, nil); err != nil {
			return err
		}
		return text("reason", p.Reason, false)
	case TypeError:
		var p Error
		if err := decodePayload(env, &p, need); err != nil {
			return err
		}
		if p.Ref != "" {
			if err := checkID("ref", p.Ref); err != nil {
				return err
			}
		}
		return errors.Join(text("code", p.Code, true), text("message", p.Message, true))
	case TypeSessionClose:
		return decodePayload(env, &struct{}{}, nil)
	}
	return nil
}

// decodePayload reads the payload into p; need, when set, refuses an absent
// one. A present payload must be an object.
func decodePayload(env *Envelope, p any, need func() error) error {
	if need != nil {
		if err := need(); err != nil {
			return err
		}
	}
	if len(env.Payload) == 0 || string(env.Payload) == "null" {
		return nil
	}
	if env.Payload[0] != '{' {
		return errors.New("not an object")
	}
	if err := json.Unmarshal(env.Payload, p); err != nil {
		return err
	}
	return nil
}

// New returns an envelope of this version carrying payload (nil for none).
func New(id, typ, session string, payload any) (Envelope, error) {
	env := Envelope{V: Version, ID: id, Type: typ, Session: session}
	if payload != nil {
		raw, err := json.Marshal(payload)
		if err != nil {
			return Envelope{}, fmt.Errorf("encode %s payload: %w", typ, err)
		}
		env.Payload = raw
	}
	return env, nil
}

// mustEnvelope is New for payloads that always encode.
func mustEnvelope(id, typ, session string, payload any) Envelope {
	env, err := New(id, typ, session, payload)
	if err != nil {
		panic(err)
	}
	return env
}

// Encode writes an envelope as one WebSocket text message.
func Encode(env Envelope) ([]byte, error) {
	data, err := json.Marshal(env)
	if err != nil {
		return nil, fmt.Errorf("encode %s envelope: %w", env.Type, err)
	}
	return data, nil
}

// Payload decodes an envelope's payload (already checked by Decode) into p.
func Payload[T any](env Envelope) (T, error) {
	var p T
	if len(env.Payload) == 0 || string(env.Payload) == "null" {
		return p, nil
	}
	if err := json.Unmarshal(env.Payload, &p); err != nil {
		return p, fmt.Errorf("%s payload: %w", env.Type, err)
	}
	return p, nil
}
