package proxy

import (
	"strconv"

	"moonji/internal/jsonguard"
)

// The closing bytes the gateway writes itself when a stream ends early, for
// each kind of stream: a stopped stream must still end the way its SDK
// helpers expect, and a broken one with an error they raise.

// StopFrames returns what closes a stream of api that a stop cut short:
// every unfinished choice given a finish_reason, the usage when the client
// asked for it (for a Responses stream, always), then the stream's end.
// A Responses stream ends with response.incomplete: SDK helpers such as
// openai-node's finalResponse() keep the text they assembled from the
// deltas, and its usage says what was generated.
func StopFrames(api API, res *RelayResult, id, model string, created int64, choices []OpenChoice, wantUsage bool, u Usage) []byte {
	switch api {
	case APIResponses:
		return ResponseEnd(res.Seq+1, "response.incomplete", id, model, created, "stopped", u)
	case APICompletions:
		b := finishChunk("text_completion", id, model, created, choices)
		if wantUsage {
			b = append(b, usageChunk("text_completion", id, model, created, u)...)
		}
		return append(b, DoneFrame...)
	default:
		b := FinishChunk(id, model, created, choices)
		if wantUsage {
			b = append(b, UsageChunk(id, model, created, u)...)
		}
		return append(b, DoneFrame...)
	}
}

// ErrorFrames returns what ends a stream of api that broke after it began:
// an error its SDK raises (and, for chat and completions, no [DONE]: the
// stream did not complete).
func ErrorFrames(api API, seq int64, message, typ, code string) []byte {
	if api != APIResponses {
		return ErrorFrame(message, typ, code)
	}
	b := make([]byte, 0, 160+len(message))
	b = append(b, "event: error\ndata: {\"type\":\"error\",\"sequence_number\":"...)
	b = strconv.AppendInt(b, seq, 10)
	b = append(b, `,"code":`...)
	b = jsonguard.AppendString(b, code)
	b = append(b, `,"message":`...)
	b = jsonguard.AppendString(b, message)
	b = append(b, `,"param":null}`+"\n\n"...)
	return b
}

// ResponseEnd formats a Responses stream's last event (typ
// response.completed, response.incomplete or response.failed) with the
// response's state. The output items are the ones the stream already
// delivered; SDKs assemble them from the deltas, so the closing response
// lists none.
func ResponseEnd(seq int64, typ, id, model string, created int64, reason string, u Usage) []byte {
	status := "completed"
	switch typ {
	case "response.incomplete":
		status = "incomplete"
	case "response.failed":
		status = "failed"
	}
	b := make([]byte, 0, 512)
	b = append(b, "event: "...)
	b = append(b, typ...)
	b = append(b, "\ndata: {\"type\":"...)
	b = jsonguard.AppendString(b, typ)
	b = append(b, `,"sequence_number":`...)
	b = strconv.AppendInt(b, seq, 10)
	b = append(b, `,"response":{"id":`...)
	b = jsonguard.AppendString(b, id)
	b = append(b, `,"object":"response","created_at":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"status":`...)
	b = jsonguard.AppendString(b, status)
	b = append(b, `,"incomplete_details":`...)
	if status == "incomplete" {
		b = append(b, `{"reason":`...)
		b = jsonguard.AppendString(b, reason)
		b = append(b, '}')
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"error":null,"model":`...)
	b = jsonguard.AppendString(b, model)
	b = append(b, `,"output":[],"usage":{"input_tokens":`...)
	b = strconv.AppendInt(b, int64(u.PromptTokens), 10)
	b = append(b, `,"input_tokens_details":{"cached_tokens":0},"output_tokens":`...)
	b = strconv.AppendInt(b, int64(u.CompletionTokens), 10)
	b = append(b, `,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":`...)
	b = strconv.AppendInt(b, int64(u.PromptTokens+u.CompletionTokens), 10)
	b = append(b, "}}}\n\n"...)
	return b
}

// ResponseCreated formats the first event of a Responses stream the gateway
// answers itself (a request stopped before the engine said anything).
func ResponseCreated(id, model string, created int64) []byte {
	b := make([]byte, 0, 256)
	b = append(b, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":"...)
	b = jsonguard.AppendString(b, id)
	b = append(b, `,"object":"response","created_at":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"status":"in_progress","incomplete_details":null,"error":null,"model":`...)
	b = jsonguard.AppendString(b, model)
	b = append(b, `,"output":[],"usage":null}}`+"\n\n"...)
	return b
}

// usageChunk is UsageChunk for a stream of another object type.
func usageChunk(object, id, model string, created int64, u Usage) []byte {
	b := make([]byte, 0, 256)
	b = append(b, `data: {"id":`...)
	b = jsonguard.AppendString(b, id)
	b = append(b, `,"object":`...)
	b = jsonguard.AppendString(b, object)
	b = append(b, `,"created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = jsonguard.AppendString(b, model)
	b = append(b, `,"choices":[],"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(u.PromptTokens), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(u.PromptTokens+u.CompletionTokens), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(u.CompletionTokens), 10)
	b = append(b, "}}\n\n"...)
	return b
}
