package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/proxy"
	"moonji/internal/responses"
	"moonji/models"
)

// The decision tables of a request's ending, each on its own: how a relayed
// stream ended and what closes it, what ends a translated one, how a
// request that got no answer ends, how a whole answer's status and the
// context's cause make its row, and which failures count against a
// backend. Then what the client gets at each point a stream is stopped,
// cut or fails, through the exchange that writes it.

var (
	errBrokenPipe = fmt.Errorf("write: %w", syscall.EPIPE)
	errCutShort   = io.ErrUnexpectedEOF
	errLinkLost   = fmt.Errorf("session 7: %w", proxy.ErrEngineDisconnected)
	errRefused    = &proxy.UpstreamError{Status: http.StatusBadGateway, Backend: "b", Err: syscall.ECONNREFUSED}
	errTimedOut   = &proxy.UpstreamError{Status: http.StatusGatewayTimeout, Backend: "b", Err: context.DeadlineExceeded}
	errUnlinked   = &proxy.UpstreamError{Status: http.StatusBadGateway, Backend: "b", Err: proxy.ErrEngineDisconnected}
	errNoEngine   = &proxy.UpstreamError{Status: http.StatusServiceUnavailable, Backend: "b", Err: proxy.ErrEngineUnavailable}
)

func TestStreamEndingOf(t *testing.T) {
	const (
		chat = proxy.APIChat
		resp = proxy.APIResponses
	)
	for _, c := range []struct {
		name     string
		api      proxy.API
		res      proxy.RelayResult
		cause    error
		timedOut bool
		outcome  string
		reason   string
		close    streamClose
	}{
		{"whole", chat, proxy.RelayResult{Done: true}, nil, false, models.OutcomeSuccess, "", closeNothing},
		{"whole, a stop too late to matter", chat, proxy.RelayResult{Done: true}, errStopped, false, models.OutcomeSuccess, "", closeNothing},
		{"whole, then the client left", chat, proxy.RelayResult{Done: true}, errClientLeft, false, models.OutcomeSuccess, "", closeNothing},

		// The engine's own error event: the SDK raises it, so the request
		// failed, and a chat stream gets the [DONE] it still lacks.
		{"engine error event, no [DONE]", chat, proxy.RelayResult{EngineError: "boom", UpstreamErr: errCutShort}, nil, false,
			models.OutcomeError, "upstream_stream_error", closeDone},
		{"engine error event, then [DONE]", chat, proxy.RelayResult{EngineError: "boom", Done: true}, nil, false,
			models.OutcomeError, "upstream_stream_error", closeNothing},
		{"engine error event, client gone", chat, proxy.RelayResult{EngineError: "boom", ClientErr: errBrokenPipe}, errClientLeft, false,
			models.OutcomeError, "upstream_stream_error", closeNothing},
		{"engine error event, Responses", resp, proxy.RelayResult{EngineError: "boom"}, nil, false,
			models.OutcomeError, "upstream_stream_error", closeNothing},
		{"engine error event beats a stop", chat, proxy.RelayResult{EngineError: "boom", Stopped: true}, errStopped, false,
			models.OutcomeError, "upstream_stream_error", closeDone},

		// A stop, seen by the relay between frames or as the context's
		// cause, closes the stream as a complete one.
		{"stopped between frames", chat, proxy.RelayResult{Stopped: true}, nil, false, models.OutcomeStopped, "stop_requested", closeStopped},
		{"stopped by the context", chat, proxy.RelayResult{UpstreamErr: context.Canceled}, errStopped, false,
			models.OutcomeStopped, "stop_requested", closeStopped},
		{"stopped, Responses", resp, proxy.RelayResult{Stopped: true}, nil, false, models.OutcomeStopped, "stop_requested", closeStopped},
		{"stopped as the timeout passed", chat, proxy.RelayResult{Stopped: true}, context.DeadlineExceeded, true,
			models.OutcomeStopped, "stop_requested", closeStopped},

		{"client stopped reading", chat, proxy.RelayResult{ClientErr: errBrokenPipe}, errClientStalled, false,
			models.OutcomeCancelled, "client_stalled", closeNothing},
		{"person disabled", chat, proxy.RelayResult{UpstreamErr: context.Canceled}, errPersonDisabled, false,
			models.OutcomeCancelled, "person_disabled", closeError},
		{"person disabled, client gone", chat, proxy.RelayResult{ClientErr: errBrokenPipe}, errPersonDisabled, false,
			models.OutcomeCancelled, "person_disabled", closeNothing},
		{"timeout", chat, proxy.RelayResult{UpstreamErr: context.DeadlineExceeded}, context.DeadlineExceeded, true,
			models.OutcomeError, "upstream_timeout", closeError},
		{"timeout without a cause", chat, proxy.RelayResult{UpstreamErr: errCutShort}, nil, true,
			models.OutcomeError, "upstream_timeout", closeError},
		{"timeout, client gone", chat, proxy.RelayResult{ClientErr: errBrokenPipe}, context.DeadlineExceeded, true,
			models.OutcomeError, "upstream_timeout", closeNothing},
		{"client gone (write failed)", chat, proxy.RelayResult{ClientErr: errBrokenPipe}, errClientLeft, false,
			models.OutcomeCancelled, "client_disconnected", closeNothing},
		{"client gone (connection watch)", chat, proxy.RelayResult{UpstreamErr: context.Canceled}, errClientLeft, false,
			models.OutcomeCancelled, "client_disconnected", closeNothing},
		{"client gone beats the engine cutting", chat, proxy.RelayResult{ClientErr: errBrokenPipe, UpstreamErr: errCutShort}, errClientLeft, false,
			models.OutcomeCancelled, "client_disconnected", closeNothing},
		{"engine link lost", chat, proxy.RelayResult{UpstreamErr: errLinkLost}, nil, false,
			models.OutcomeError, "engine_disconnected", closeError},
		{"engine cut the stream", chat, proxy.RelayResult{UpstreamErr: errCutShort}, nil, false,
			models.OutcomeError, "upstream_disconnected", closeError},
		{"engine cut the stream, Responses", resp, proxy.RelayResult{UpstreamErr: errCutShort}, nil, false,
			models.OutcomeError, "upstream_disconnected", closeError},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := streamEndingOf(c.api, &c.res, c.cause, c.timedOut)
			if e.outcome != c.outcome || e.reason != c.reason || e.close != c.close {
				t.Errorf("got %s/%q closed by %d, want %s/%q closed by %d", e.outcome, e.reason, e.close, c.outcome, c.reason, c.close)
			}
			if e.close == closeError && (e.message == "" || e.typ == "") {
				t.Errorf("an error close needs its message and type: %+v", e)
			}
		})
	}
}

func TestTranslatedEnd(t *testing.T) {
	for _, c := range []struct {
		outcome, reason         string
		clientGone, engineError bool
		want                    string
		end                     bool
	}{
		{models.OutcomeStopped, "stop_requested", false, false, responses.Stopped, true},
		{models.OutcomeStopped, "stop_requested", true, false, responses.Stopped, true},
		{models.OutcomeCancelled, "person_disabled", false, false, personDisabledMessage, true},
		{models.OutcomeCancelled, "person_disabled", true, false, "", false},
		{models.OutcomeSuccess, "", false, false, "", false},
		{models.OutcomeCancelled, "client_disconnected", true, false, "", false},
		{models.OutcomeCancelled, "client_stalled", true, false, "", false},
		{models.OutcomeError, "upstream_stream_error", false, true, "", false},
		{models.OutcomeError, "upstream_timeout", true, false, "", false},
		{models.OutcomeError, "upstream_timeout", false, false, "upstream_timeout", true},
		{models.OutcomeError, "upstream_disconnected", false, false, "upstream_disconnected", true},
		{models.OutcomeError, "engine_disconnected", false, false, "engine_disconnected", true},
	} {
		got, end := translatedEnd(c.outcome, c.reason, c.clientGone, c.engineError)
		if got != c.want || end != c.end {
			t.Errorf("%s/%s (client gone %v, engine error %v): got %q %v, want %q %v",
				c.outcome, c.reason, c.clientGone, c.engineError, got, end, c.want, c.end)
		}
	}
}

func TestFailureOf(t *testing.T) {
	for _, c := range []struct {
		name       string
		cause, err error
		outcome    string
		reason     string
		status     int
		code       string
		billPrompt bool
		retryAfter string
	}{
		{"stopped", errStopped, context.Canceled, models.OutcomeStopped, "stop_requested", 499, "", true, ""},
		{"stopped while the backend was unreachable", errStopped, errRefused, models.OutcomeStopped, "stop_requested", 499, "", true, ""},
		{"client left", errClientLeft, context.Canceled, models.OutcomeCancelled, "client_disconnected", 499, "client_closed_request", true, ""},
		{"client left while queued", errClientLeft, context.Canceled, models.OutcomeCancelled, "client_disconnected", 499, "client_closed_request", true, ""},
		{"person disabled", errPersonDisabled, context.Canceled, models.OutcomeCancelled, "person_disabled", 403, "person_disabled", true, ""},
		{"timeout", context.DeadlineExceeded, context.DeadlineExceeded, models.OutcomeError, "upstream_timeout", 504, "upstream_timeout", false, ""},
		{"the call's own timeout", nil, fmt.Errorf("read: %w", context.DeadlineExceeded), models.OutcomeError, "upstream_timeout", 504, "upstream_timeout", false, ""},
		{"engine not connected", nil, errNoEngine, models.OutcomeRejected, "engine_unavailable", 503, "engine_unavailable", false, "1"},
		{"refused", nil, errRefused, models.OutcomeError, "upstream_unreachable", 502, "upstream_unreachable", false, ""},
		{"backend's 504", nil, errTimedOut, models.OutcomeError, "upstream_timeout", 504, "upstream_timeout", false, ""},
		{"engine link lost", nil, errUnlinked, models.OutcomeError, "engine_disconnected", 502, "engine_disconnected", false, ""},
		{"answer failed", nil, errCutShort, models.OutcomeError, "upstream_read_failed", 502, "upstream_read_failed", false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := failureOf(c.cause, c.err, "b1")
			if f.outcome != c.outcome || f.reason != c.reason || f.status != c.status || f.code != c.code ||
				f.billPrompt != c.billPrompt || f.retryAfter != c.retryAfter {
				t.Errorf("got %+v", f)
			}
			// A stop is answered as if the engine had said nothing; every
			// other failure with an error naming what went wrong.
			if c.outcome != models.OutcomeStopped && (f.message == "" || f.typ == "") {
				t.Errorf("no error to answer with: %+v", f)
			}
			if f.typ == "server_error" && !strings.Contains(f.message, "b1") {
				t.Errorf("a backend's failure names it: %q", f.message)
			}
		})
	}
}

func TestAnswerEnding(t *testing.T) {
	for _, c := range []struct {
		status  int
		cause   error
		outcome string
		reason  string
		row     int
	}{
		{200, nil, models.OutcomeSuccess, "", 200},
		{400, nil, models.OutcomeError, "upstream_400", 400},
		{404, nil, models.OutcomeError, "upstream_404", 404},
		{422, nil, models.OutcomeError, "upstream_422", 422},
		{500, nil, models.OutcomeError, "upstream_500", 500},
		{503, nil, models.OutcomeError, "upstream_503", 503},
		// The answer came, but the client had left before it.
		{200, errClientLeft, models.OutcomeCancelled, "client_disconnected", 200},
		{500, errClientLeft, models.OutcomeCancelled, "client_disconnected", 500},
		// The answer came, but its person lost their access meanwhile.
		{200, errPersonDisabled, models.OutcomeCancelled, "person_disabled", 403},
		{429, errPersonDisabled, models.OutcomeCancelled, "person_disabled", 403},
		// A stop that lands once the whole answer is in changes nothing.
		{200, errStopped, models.OutcomeSuccess, "", 200},
	} {
		outcome, reason, row := answerEnding(c.status, c.cause)
		if outcome != c.outcome || reason != c.reason || row != c.row {
			t.Errorf("%d, cause %v: got %s/%q/%d, want %s/%q/%d", c.status, c.cause, outcome, reason, row, c.outcome, c.reason, c.row)
		}
	}
}

func TestBackendFailure(t *testing.T) {
	for _, c := range []struct {
		name   string
		cause  error
		err    error
		status int
		want   string
	}{
		{"answered", nil, nil, 200, ""},
		{"client error status", nil, nil, 400, ""},
		{"server error status", nil, nil, 500, "status 500"},
		{"unavailable status", nil, nil, 503, "status 503"},
		{"refused", nil, errRefused, 0, "unreachable"},
		{"backend's timeout", nil, errTimedOut, 0, ""},
		{"engine not connected", nil, errNoEngine, 0, "engine not connected"},
		{"engine link lost", nil, errUnlinked, 0, "engine disconnected"},
		{"answer cut short", nil, errCutShort, 0, ""},
		// A request the client left, stopped or outlived is no failure of
		// the backend's, whatever the call met.
		{"client left", errClientLeft, errRefused, 0, ""},
		{"stopped", errStopped, nil, 502, ""},
		{"timed out", context.DeadlineExceeded, errRefused, 0, ""},
	} {
		if got := backendFailure(c.cause, c.err, c.status); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

// chatChunk is one frame of an engine's chat stream.
func chatChunk(index int, delta, finish string) string {
	return `data: {"id":"chatcmpl-e","object":"chat.completion.chunk","created":7,"model":"up","choices":[{"index":` +
		fmt.Sprint(index) + `,"delta":` + delta + `,"logprobs":null,"finish_reason":` + finish + `}]}` + "\n\n"
}

// responsesEvent is one event of an engine's Responses stream.
func responsesEvent(typ string, seq int, rest string) string {
	return "event: " + typ + "\ndata: {\"type\":\"" + typ + "\",\"sequence_number\":" + fmt.Sprint(seq) + rest + "}\n\n"
}

// failingReader hands out r, then fails with err.
type failingReader struct {
	r   io.Reader
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, f.err
	}
	return n, err
}

// testExchange is an exchange for body to api whose engine has it, as far
// as deciding its ending needs.
func testExchange(t *testing.T, api proxy.API, body string) *exchange {
	t.Helper()
	req, err := proxy.ParseFor(api, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	t.Cleanup(func() { cancel(nil) })
	call := Call{API: api, ID: "inf_t", Start: time.Unix(1700000000, 0), Body: []byte(body)}
	return &exchange{g: &Gateway{log: slog.New(slog.DiscardHandler)}, call: call, req: req, up: req.API,
		ctx: ctx, cancel: cancel, sent: true, row: models.Usage{Model: req.Model}}
}

// frames describes the SSE frames of b, one string each: "[DONE]"; a
// chunk's choices ("finish 0=stop", "+role" for a choice's first chunk;
// "text" for a completions chunk), "usage" with its completion tokens; an
// error ("error <code>"); a Responses event ("<type> #<seq>", and the
// incomplete reason or the error code).
func frames(t *testing.T, b []byte) []string {
	t.Helper()
	var out []string
	for _, f := range strings.Split(string(b), "\n\n") {
		if f == "" {
			continue
		}
		var event, data string
		for _, line := range strings.Split(f, "\n") {
			switch {
			case strings.HasPrefix(line, "event: "):
				event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				data = strings.TrimPrefix(line, "data: ")
			default:
				t.Fatalf("not an SSE frame: %q", f)
			}
		}
		v := gjson.Parse(data)
		switch {
		case data == "[DONE]":
			out = append(out, "[DONE]")
		case event != "":
			s := event + " #" + v.Get("sequence_number").String()
			if r := v.Get("response.incomplete_details.reason"); r.Exists() {
				s += " " + r.String()
			}
			if v.Get("code").Exists() {
				s += " " + v.Get("code").String()
			}
			out = append(out, s)
		case v.Get("error").Exists():
			out = append(out, "error "+v.Get("error.code").String())
		case len(v.Get("choices").Array()) > 0:
			s := "finish"
			if v.Get("object").Str == "text_completion" {
				s = "text finish"
			}
			for _, ch := range v.Get("choices").Array() {
				s += " " + ch.Get("index").String()
				if ch.Get("delta.role").Exists() {
					s += "+role"
				}
				s += "=" + ch.Get("finish_reason").String()
			}
			out = append(out, s)
		case v.Get("usage").Exists():
			out = append(out, "usage "+v.Get("usage.completion_tokens").String())
		default:
			t.Fatalf("unexpected frame %q", f)
		}
	}
	return out
}

// What the client gets when its stream ends at each point — stopped, cut
// by the engine, failed, timed out, left — and the row it leaves: the
// exchange relays the engine's frames, then writes the stream's end.
func TestStreamClosing(t *testing.T) {
	const (
		chatBody  = `{"model":"m","stream":true,"messages":[{"role":"user","content":"tell me a story about a lighthouse"}]}`
		usageBody = `{"model":"m","stream":true,"stream_options":{"include_usage":true},"n":2,"messages":[{"role":"user","content":"two stories"}]}`
		cmplBody  = `{"model":"m","stream":true,"prompt":"once upon a time"}`
		respBody  = `{"model":"m","stream":true,"input":"tell me a story"}`
	)
	story := chatChunk(0, `{"role":"assistant","content":""}`, "null") + chatChunk(0, `{"content":"Once"}`, "null") +
		chatChunk(0, `{"content":" upon"}`, "null")
	twoStories := chatChunk(0, `{"role":"assistant","content":"A"}`, "null") + chatChunk(1, `{"role":"assistant","content":"B"}`, "null") +
		chatChunk(1, `{}`, `"length"`) + chatChunk(0, `{"content":"a"}`, "null")
	cmpl := `data: {"id":"cmpl-e","object":"text_completion","created":7,"model":"up","choices":[{"index":0,"text":" there","logprobs":null,"finish_reason":null}]}` + "\n\n"
	respEvents := responsesEvent("response.created", 0, `,"response":{"id":"resp_e","object":"response","created_at":7,"status":"in_progress","model":"up","output":[]}`) +
		responsesEvent("response.output_text.delta", 1, `,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Once"`) +
		responsesEvent("response.output_text.delta", 2, `,"item_id":"msg_1","output_index":0,"content_index":0,"delta":" upon"`)
	engineError := `data: {"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}` + "\n\n"

	for _, c := range []struct {
		name      string
		api       proxy.API
		body      string
		engine    string   // the engine's frames; the stream ends with them (EOF) unless stopAfter
		stop      bool     // a stop lands …
		stopAfter int      // … once this many frames reached the client
		readErr   error    // the engine's stream ends with this instead of EOF
		cause     error    // why the request's context ended before the end was decided
		clientErr bool     // writing to the client failed
		stalled   bool     // … because its write deadline passed
		timedOut  bool     // the request's own timeout passed
		translate bool     // a Responses request translated for a chat engine
		want      []string // the closing frames
		outcome   string   // the row's
		reason    string   // the row's
		check     func(t *testing.T, x *exchange)
	}{
		{name: "chat stopped after its first words", api: proxy.APIChat, body: chatBody, engine: story, stop: true, stopAfter: 2,
			want: []string{"finish 0=stop", "[DONE]"}, outcome: models.OutcomeStopped, reason: "stop_requested",
			check: func(t *testing.T, x *exchange) {
				if x.row.CompletionTokens != 1 || x.row.UsageSource != models.UsageFromCounted {
					t.Errorf("billed %d counted tokens (%s), want the 1 chunk delivered", x.row.CompletionTokens, x.row.UsageSource)
				}
			}},
		{name: "chat stopped before anything reached the client", api: proxy.APIChat, body: chatBody, engine: story, stop: true, stopAfter: 0,
			want: []string{"finish 0+role=stop", "[DONE]"}, outcome: models.OutcomeStopped, reason: "stop_requested"},
		{name: "chat stopped by the context's cause", api: proxy.APIChat, body: chatBody, engine: story, readErr: context.Canceled,
			cause: errStopped, want: []string{"finish 0=stop", "[DONE]"}, outcome: models.OutcomeStopped, reason: "stop_requested"},
		{name: "chat with n=2 and usage stopped", api: proxy.APIChat, body: usageBody, engine: twoStories, stop: true, stopAfter: 3,
			// Choice 1 had its finish_reason; choice 0 is closed, then the
			// usage the client asked for: the 2 content chunks delivered.
			want: []string{"finish 0=stop", "usage 2", "[DONE]"}, outcome: models.OutcomeStopped, reason: "stop_requested",
			check: func(t *testing.T, x *exchange) {
				if x.row.PromptTokens <= 0 || x.row.UsageSource != models.UsageEstimated {
					t.Errorf("the prompt the engine read is billed, estimated: %d (%s)", x.row.PromptTokens, x.row.UsageSource)
				}
			}},
		{name: "completions stopped", api: proxy.APICompletions, body: cmplBody, engine: cmpl + cmpl, stop: true, stopAfter: 1,
			want: []string{"text finish 0=stop", "[DONE]"}, outcome: models.OutcomeStopped, reason: "stop_requested"},
		{name: "Responses stopped", api: proxy.APIResponses, body: respBody, engine: respEvents, stop: true, stopAfter: 3,
			want: []string{"response.incomplete #3 stopped"}, outcome: models.OutcomeStopped, reason: "stop_requested",
			check: func(t *testing.T, x *exchange) {
				if x.row.ResponseID != "resp_e" {
					t.Errorf("response id %q, want the engine's", x.row.ResponseID)
				}
			}},
		{name: "Responses stopped on an event it drops", api: proxy.APIResponses, body: respBody, engine: respEvents, stop: true, stopAfter: 2,
			// #2 never reaches the client: the closing event takes its number.
			want: []string{"response.incomplete #2 stopped"}, outcome: models.OutcomeStopped, reason: "stop_requested"},
		{name: "translated Responses stopped", api: proxy.APIResponses, body: respBody, engine: story, stop: true, stopAfter: 2, translate: true,
			// A stopped translation closes as a finished response, which
			// both SDKs' final-response helpers accept.
			want:    []string{"response.output_text.done #5", "response.content_part.done #6", "response.output_item.done #7", "response.completed #8"},
			outcome: models.OutcomeStopped, reason: "stop_requested",
			check: func(t *testing.T, x *exchange) {
				if x.row.ResponseID != "resp_inf_t" {
					t.Errorf("response id %q, want the gateway's", x.row.ResponseID)
				}
			}},

		{name: "chat whole", api: proxy.APIChat, body: chatBody, engine: story + chatChunk(0, `{}`, `"stop"`) + "data: [DONE]\n\n",
			want: nil, outcome: models.OutcomeSuccess},
		{name: "chat cut by the engine", api: proxy.APIChat, body: chatBody, engine: story,
			want: []string{"error upstream_disconnected"}, outcome: models.OutcomeError, reason: "upstream_disconnected"},
		{name: "completions cut by the engine", api: proxy.APICompletions, body: cmplBody, engine: cmpl,
			want: []string{"error upstream_disconnected"}, outcome: models.OutcomeError, reason: "upstream_disconnected"},
		{name: "Responses cut by the engine", api: proxy.APIResponses, body: respBody, engine: respEvents,
			want: []string{"error #3 upstream_disconnected"}, outcome: models.OutcomeError, reason: "upstream_disconnected"},
		{name: "translated Responses cut by the engine", api: proxy.APIResponses, body: respBody, engine: story, translate: true,
			want: []string{"error #6 server_error", "response.failed #7"}, outcome: models.OutcomeError, reason: "upstream_disconnected"},
		{name: "chat's engine link lost", api: proxy.APIChat, body: chatBody, engine: story, readErr: errLinkLost,
			want: []string{"error engine_disconnected"}, outcome: models.OutcomeError, reason: "engine_disconnected"},
		{name: "chat's engine error event", api: proxy.APIChat, body: chatBody, engine: story + engineError,
			want: []string{"[DONE]"}, outcome: models.OutcomeError, reason: "upstream_stream_error"},
		{name: "chat's engine error event, then [DONE]", api: proxy.APIChat, body: chatBody, engine: story + engineError + "data: [DONE]\n\n",
			want: nil, outcome: models.OutcomeError, reason: "upstream_stream_error"},
		{name: "chat timed out", api: proxy.APIChat, body: chatBody, engine: story, readErr: context.DeadlineExceeded, timedOut: true,
			want: []string{"error upstream_timeout"}, outcome: models.OutcomeError, reason: "upstream_timeout"},
		{name: "Responses timed out", api: proxy.APIResponses, body: respBody, engine: respEvents, readErr: context.DeadlineExceeded, timedOut: true,
			want: []string{"error #3 upstream_timeout"}, outcome: models.OutcomeError, reason: "upstream_timeout"},
		{name: "chat's person disabled", api: proxy.APIChat, body: chatBody, engine: story, readErr: context.Canceled, cause: errPersonDisabled,
			want: []string{"error person_disabled"}, outcome: models.OutcomeCancelled, reason: "person_disabled"},
		{name: "chat's client gone", api: proxy.APIChat, body: chatBody, engine: story, clientErr: true,
			want: nil, outcome: models.OutcomeCancelled, reason: "client_disconnected"},
		{name: "chat's client stopped reading", api: proxy.APIChat, body: chatBody, engine: story, clientErr: true, stalled: true,
			want: nil, outcome: models.OutcomeCancelled, reason: "client_stalled"},
		{name: "chat's client gone as the request timed out", api: proxy.APIChat, body: chatBody, engine: story, clientErr: true, timedOut: true,
			want: nil, outcome: models.OutcomeError, reason: "upstream_timeout"},
	} {
		t.Run(c.name, func(t *testing.T) {
			x := testExchange(t, c.api, c.body)
			if c.timedOut {
				var cancel context.CancelFunc
				x.ctx, cancel = context.WithDeadline(x.ctx, time.Now().Add(-time.Second))
				t.Cleanup(cancel)
			}
			if c.cause != nil {
				x.cancel(c.cause)
			}
			opts := proxy.RelayOptions{API: c.api, StripUsage: !x.req.ClientWantsUsage && c.api != proxy.APIResponses}
			if c.translate {
				x.translate, x.up = true, proxy.APIChat
				x.tr = responses.NewStream(x.call.Body, x.answerID(), x.call.Start.Unix())
				opts.API, opts.Transform = proxy.APIChat, x.tr.Frame
			}
			if c.stop {
				checks := 0
				opts.Stopped = func() bool { checks++; return checks > c.stopAfter }
			}
			var engine io.Reader = strings.NewReader(c.engine)
			if c.readErr != nil {
				engine = &failingReader{r: engine, err: c.readErr}
			}
			var client strings.Builder
			res := proxy.Relay(bufio.NewWriter(&client), bufio.NewReader(engine), opts)
			if c.clientErr {
				res.ClientErr = errBrokenPipe
				if c.stalled {
					x.writeDeadline = time.Now().Add(-time.Second)
				}
			}
			closing := x.closing(&res)
			got := frames(t, closing)
			if !slices.Equal(got, c.want) {
				t.Errorf("closing frames %q, want %q", got, c.want)
			}
			if c.api == proxy.APIResponses {
				// Every event the client gets, the closing ones too, has
				// the next sequence number: none skipped, none repeated.
				next := int64(0)
				for _, f := range strings.Split(client.String()+string(closing), "\n\n") {
					if _, data, ok := strings.Cut(f, "data: "); ok {
						if n := gjson.Get(data, "sequence_number").Int(); n != next {
							t.Errorf("event %q has sequence number %d, want %d", f, n, next)
							break
						}
						next++
					}
				}
			}
			if x.row.Outcome != c.outcome || x.row.Reason != c.reason || x.row.Status != http.StatusOK {
				t.Errorf("row %s/%q/%d, want %s/%q/200", x.row.Outcome, x.row.Reason, x.row.Status, c.outcome, c.reason)
			}
			if c.clientErr && context.Cause(x.ctx) == nil {
				t.Error("a failed write to the client ends the request's context")
			}
			if c.check != nil {
				c.check(t, x)
			}
		})
	}
}

// What a request stopped before its engine said anything gets: a stream a
// well-formed one that opens and closes at once, a whole answer an empty
// one in the API's shape (embeddings, which have none, a 499).
func TestStoppedBeforeAnswer(t *testing.T) {
	for _, c := range []struct {
		name   string
		api    proxy.API
		body   string
		status int
		want   []string // a stream's frames
		check  func(t *testing.T, body gjson.Result)
	}{
		{name: "chat stream", api: proxy.APIChat, body: `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			status: 200, want: []string{"finish 0+role=stop", "[DONE]"}},
		{name: "chat stream, n=2 with usage", api: proxy.APIChat,
			body:   `{"model":"m","stream":true,"n":2,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`,
			status: 200, want: []string{"finish 0+role=stop 1+role=stop", "usage 0", "[DONE]"}},
		{name: "completions stream", api: proxy.APICompletions, body: `{"model":"m","stream":true,"prompt":"hi"}`,
			status: 200, want: []string{"text finish 0=stop", "[DONE]"}},
		{name: "Responses stream", api: proxy.APIResponses, body: `{"model":"m","stream":true,"input":"hi"}`,
			status: 200, want: []string{"response.created #0", "response.incomplete #1 stopped"}},
		{name: "chat", api: proxy.APIChat, body: `{"model":"m","n":3,"messages":[{"role":"user","content":"hi"}]}`, status: 200,
			check: func(t *testing.T, b gjson.Result) {
				if b.Get("object").Str != "chat.completion" || b.Get("id").Str != "chatcmpl-inf_t" || len(b.Get("choices").Array()) != 3 ||
					b.Get("choices.2.message.content").Str != "" || b.Get("choices.2.finish_reason").Str != "stop" {
					t.Errorf("answer %s", b.Raw)
				}
			}},
		{name: "completions", api: proxy.APICompletions, body: `{"model":"m","prompt":"hi"}`, status: 200,
			check: func(t *testing.T, b gjson.Result) {
				if b.Get("object").Str != "text_completion" || b.Get("id").Str != "cmpl-inf_t" || b.Get("choices.0.text").Str != "" {
					t.Errorf("answer %s", b.Raw)
				}
			}},
		{name: "Responses", api: proxy.APIResponses, body: `{"model":"m","input":"hi"}`, status: 200,
			check: func(t *testing.T, b gjson.Result) {
				if b.Get("status").Str != "incomplete" || b.Get("incomplete_details.reason").Str != "stopped" || b.Get("id").Str != "resp_inf_t" {
					t.Errorf("answer %s", b.Raw)
				}
			}},
		{name: "embeddings", api: proxy.APIEmbeddings, body: `{"model":"m","input":"hi"}`, status: 499,
			check: func(t *testing.T, b gjson.Result) {
				if b.Get("error.code").Str != "stopped" {
					t.Errorf("answer %s", b.Raw)
				}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x := testExchange(t, c.api, c.body)
			r := x.stoppedBeforeAnswer()
			if r.Status != c.status {
				t.Fatalf("status %d, want %d", r.Status, c.status)
			}
			if c.want != nil {
				if r.BodyStream == nil || !strings.HasPrefix(r.ContentType, "text/event-stream") {
					t.Fatalf("not a stream: %+v", r)
				}
				b, _ := io.ReadAll(r.BodyStream)
				if got := frames(t, b); !slices.Equal(got, c.want) {
					t.Errorf("frames %q, want %q", got, c.want)
				}
				return
			}
			if r.BodyStream != nil || r.ContentType != "application/json" {
				t.Fatalf("not a whole answer: %+v", r)
			}
			c.check(t, gjson.ParseBytes(r.Body))
		})
	}
}
