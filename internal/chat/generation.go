package chat

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/gateway"
	"moonji/internal/jsonguard"
	"moonji/internal/stop"
	"moonji/models"
)

// maxLogBytes caps a generation's text: past it the generation is ended
// as an error (the log is held in memory for every viewer).
const maxLogBytes = 1 << 20

// saveEvery is how often the partial text of a streaming reply is saved,
// so a crash or a viewer on another replica loses at most this much.
const saveEvery = time.Second

// generation is one assistant reply being written.
type generation struct {
	s      *Service
	id     string // inference id
	msgID  string
	convID string
	userID uint
	log    *Log
	// ended is closed once the final state is saved.
	ended chan struct{}
	// stopRun is the reply's registration for Stop (nil without a stop
	// service): made by start, ended by the gateway once it has the call
	// (Call.Stop), or by start when the gateway never gets it (endStop).
	stopRun *stop.Run

	// The fields below belong to the goroutine running the request (the
	// gateway calls OnEnd on it too).
	finished  bool
	streaming bool // the answer's stream is being read
	end       *gateway.End
	overflow  bool
	engineErr string
	lastSave  time.Time
	// savedChunks is how many chunks the last partial save took; saving
	// is set while one is in flight.
	savedChunks int
	saving      atomic.Bool
}

// run sends the request through the gateway and reads its answer.
func (g *generation) run(p gateway.Principal, body []byte) {
	defer g.s.wg.Done()
	defer g.s.release(g)
	// A panic here would take every stream of the process with it: the
	// reply fails alone (the gateway has recovered its own part, and
	// written the request's row).
	defer func() {
		if r := recover(); r != nil {
			g.s.log.Error("chat generation panicked; its reply fails", "inference_id", g.id, "panic", fmt.Sprint(r),
				"stack", string(debug.Stack()))
			g.finish(models.MessageEnd{Status: models.MessageError, Content: g.log.Text(-1), Reason: "The answer failed (internal error)."})
		}
	}()
	resp := g.s.o.Gateway.ChatCompletions(gateway.Call{ID: g.id, Start: time.Now(), Principal: p, Body: body, OnEnd: g.onEnd,
		Stop: g.stopRun})
	switch {
	case g.finished:
		// Ended before any answer (a stop while queued): the response is
		// the gateway's well-formed empty stream.
		if resp.BodyStream != nil {
			_, _ = io.Copy(io.Discard, resp.BodyStream)
			_ = resp.BodyStream.Close()
		}
	case resp.Status == http.StatusOK && resp.BodyStream != nil:
		g.read(resp.BodyStream)
	case resp.Status == http.StatusOK:
		// A whole answer, though a stream was asked for.
		text := gjson.GetBytes(resp.Body, "choices.0.message.content").String()
		if text != "" {
			g.log.Append(text)
		}
		g.finishFromEnd()
	default:
		end := models.MessageEnd{Status: models.MessageError, Content: g.log.Text(-1), Reason: errorMessage(resp)}
		if g.end != nil {
			end.PromptTokens, end.CompletionTokens, end.Cost = g.end.Row.PromptTokens, g.end.Row.CompletionTokens, g.end.Row.Cost
		}
		g.finish(end)
	}
	if !g.finished {
		g.finish(models.MessageEnd{Status: models.MessageError, Content: g.log.Text(-1), Reason: "The answer ended unexpectedly."})
	}
}

// endStop ends the reply's registration for Stop when the gateway never
// got the call that takes it over.
func (g *generation) endStop(outcome string) {
	if g.stopRun != nil {
		g.stopRun.EndWith(outcome)
	}
}

// errorMessage is the readable part of an error answer in OpenAI's shape.
func errorMessage(resp *gateway.Response) string {
	if m := gjson.GetBytes(resp.Body, "error.message"); m.Type == gjson.String && m.Str != "" {
		return m.Str
	}
	return fmt.Sprintf("The request failed (HTTP %d).", resp.Status)
}

// read reads the answer's SSE frames into the log. Closing the stream (at
// its end, or early when the log is full) finishes the request in the
// gateway, which calls onEnd from inside Read or Close.
func (g *generation) read(stream io.ReadCloser) {
	g.streaming = true
	defer stream.Close()
	err := readData(bufio.NewReaderSize(stream, 32<<10), func(payload []byte) bool {
		g.frame(readDelta(payload))
		if g.overflow {
			// Closing early cuts the engine off; the gateway ends the
			// request (and calls onEnd) right there.
			_ = stream.Close()
			return false
		}
		return true
	})
	if err != nil {
		g.s.log.Warn("read chat answer", "inference_id", g.id, "err", err)
	}
}

// readData calls fn with the payload of each "data:" line of an SSE
// stream (the field name, one optional space and the line end cut), until
// fn returns false or the stream ends; it returns the read error, nil at
// the end of the stream. The payload is valid only during the call.
func readData(br *bufio.Reader, fn func(payload []byte) bool) error {
	for {
		line, err := br.ReadBytes('\n')
		if payload, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:")); ok {
			if !fn(bytes.TrimPrefix(payload, []byte(" "))) {
				return nil
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read SSE line: %w", err)
		}
	}
}

// delta is what one data payload of the answer holds for the chat: a piece
// of the first choice's text, an error the engine reported, or nothing.
type delta struct {
	text      string
	engineErr string
}

// readDelta reads one data payload of the answer. Anything that is not a
// JSON chunk ([DONE], a comment, a torn frame) holds nothing.
func readDelta(payload []byte) delta {
	// jsonguard, not gjson.ValidBytes: an engine's frame may be up to 4 MB,
	// and gjson's validator recurses once per nesting level.
	if len(payload) == 0 || string(payload) == "[DONE]" || jsonguard.Validate(payload, nil) != nil {
		return delta{}
	}
	if e := gjson.GetBytes(payload, "error"); e.Exists() && e.Type != gjson.Null {
		msg := e.Get("message").String()
		if msg == "" {
			msg = "The model reported an error."
		}
		return delta{engineErr: msg}
	}
	return delta{text: gjson.GetBytes(payload, "choices.0.delta.content").String()}
}

// frame takes one data payload of the answer.
func (g *generation) frame(d delta) {
	if d.engineErr != "" {
		g.engineErr = d.engineErr
		return
	}
	text := d.text
	if text == "" {
		return
	}
	if g.log.Append(text) > maxLogBytes {
		g.overflow = true
		return
	}
	if time.Since(g.lastSave) >= saveEvery {
		g.saveProgress()
	}
}

// saveProgress stores the text so far, off the reading goroutine: a save
// that waits for a busy database must not pause the reply for its viewers
// (saved inline, 500 replies at once on SQLite held their viewers' chunks
// back by seconds). One save is in flight at a time; a tick that finds one
// running skips, and the next tick saves the newer text. A failure is
// logged, not fatal: the final save writes everything. A save that lands
// after the final one changes nothing (it updates only a streaming row).
func (g *generation) saveProgress() {
	g.lastSave = time.Now()
	n := g.log.Len()
	if n == g.savedChunks || !g.saving.CompareAndSwap(false, true) {
		return
	}
	g.savedChunks = n
	text := g.log.Text(n)
	g.s.wg.Add(1)
	go func() {
		defer g.s.wg.Done()
		defer g.saving.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := models.SaveMessageContent(ctx, g.s.o.DB, g.msgID, text); err != nil {
			g.s.log.Warn("save partial answer", "inference_id", g.id, "err", err)
		}
	}()
}

// onEnd is the gateway's OnEnd: the request is over. A stop's end is saved
// here and now, before the stop is acknowledged, so a reload after the
// stop's 200 shows exactly what was kept; so is the end of a streamed
// answer. An end before any answer waits for the Response, whose error
// message says more than the usage row's reason.
func (g *generation) onEnd(end gateway.End) {
	g.end = &end
	if end.Row.Outcome == models.OutcomeStopped || g.streaming {
		g.finishFromEnd()
	}
}

// finishFromEnd saves the final state the gateway's end tells.
func (g *generation) finishFromEnd() {
	if g.finished {
		return
	}
	e := models.MessageEnd{Status: models.MessageDone, Content: g.log.Text(-1)}
	var row models.Usage
	if g.end != nil {
		row = g.end.Row
	}
	e.PromptTokens, e.CompletionTokens, e.Cost = row.PromptTokens, row.CompletionTokens, row.Cost
	switch {
	case g.overflow:
		e.Status, e.Reason = models.MessageError, fmt.Sprintf("The answer grew past %d KiB and was cut.", maxLogBytes>>10)
	case g.engineErr != "":
		e.Status, e.Reason = models.MessageError, g.engineErr
	case row.Outcome == models.OutcomeStopped:
		e.Status = models.MessageStopped
		if g.end.SeenOK {
			// Exactly what the person's page showed when they pressed Stop.
			e.Content = g.log.Text(g.end.Seen)
		}
	case row.Outcome == models.OutcomeSuccess || g.end == nil:
	default:
		e.Status, e.Reason = models.MessageError, readableReason(row.Reason)
	}
	g.finish(e)
}

// readableReason turns a usage row's reason into words for the page.
func readableReason(reason string) string {
	switch reason {
	case "upstream_timeout":
		return "The model took too long to answer."
	case "upstream_disconnected", "upstream_read_failed":
		return "The model's answer broke off."
	case "upstream_unreachable":
		return "The model could not be reached."
	case "upstream_stream_error":
		return "The model reported an error."
	case "person_disabled":
		return "Your access was withdrawn by an administrator."
	case "":
		return "The answer failed."
	default:
		return "The answer failed (" + reason + ")."
	}
}

// finish saves the final state once, then tells the viewers.
func (g *generation) finish(e models.MessageEnd) {
	if g.finished {
		return
	}
	g.finished = true
	g.saveFinal(e)
	g.log.Finish(Final{Status: e.Status, Content: models.StorableText(e.Content), Reason: e.Reason,
		PromptTokens: e.PromptTokens, CompletionTokens: e.CompletionTokens, Cost: e.Cost})
	close(g.ended)
}

// finalSaveTries bound the final save's attempts (5 s each, with pauses of
// 0.5, 1, 2, 4 s between): a database too busy for one attempt must not
// leave the reply streaming in it, which would also refuse the next message
// of the conversation until a restart.
const finalSaveTries = 5

// saveFinal stores how the reply ended, trying again while the database
// fails.
func (g *generation) saveFinal(e models.MessageEnd) {
	pause := 500 * time.Millisecond
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := models.FinishMessage(ctx, g.s.o.DB, g.msgID, e)
		cancel()
		if err == nil {
			return
		}
		if try == finalSaveTries {
			g.s.log.Error("save chat answer: giving up", "inference_id", g.id, "tries", try, "err", err)
			return
		}
		g.s.log.Warn("save chat answer, trying again", "inference_id", g.id, "try", try, "err", err)
		time.Sleep(pause)
		pause *= 2
	}
}
