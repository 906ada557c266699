package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptrace"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// What a client saw of its request.
const (
	sawComplete = "complete" // the whole answer, or a stream to [DONE]
	sawStopped  = "stopped"  // a stop it asked for was acknowledged, and the stream ended
	sawAborted  = "aborted"  // it left before the end
	sawError    = "error"    // an error status, or an error frame in the stream
	sawCut      = "cut"      // the gateway's connection ended before the stream's end
	sawFailed   = "failed"   // no answer at all (connection refused, timeout)
)

// record is one request and what its client saw.
type record struct {
	Kind    string    `json:"kind"`
	Replica int       `json:"replica"`
	Fault   string    `json:"fault"` // the fault injected when it began, if any
	At      time.Time `json:"at"`
	Dur     float64   `json:"dur_s"`
	ID      string    `json:"id"`
	Status  int       `json:"status"`
	Saw     string    `json:"saw"`
	Sent    bool      `json:"sent"` // the inference request left (a failed sign-in never sends one)
	Detail  string    `json:"detail,omitempty"`
}

// kinds of traffic, with their weights.
var kinds = []struct {
	name   string
	weight int
}{
	{"stream", 24}, {"whole", 18}, {"stop", 10}, {"abort", 14},
	{"link_stream", 10}, {"link_whole", 6}, {"chat", 12}, {"chat_stop", 6},
}

func pickKind(r *rand.Rand) string {
	total := 0
	for _, k := range kinds {
		total += k.weight
	}
	n := r.IntN(total)
	for _, k := range kinds {
		if n -= k.weight; n < 0 {
			return k.name
		}
	}
	return kinds[0].name
}

const msgs = `"messages":[{"role":"user","content":"tell me a story"}]`

func v1Body(kind string) string {
	model := "m1"
	if strings.HasPrefix(kind, "link_") {
		model = "mlink"
	}
	switch kind {
	case "whole", "link_whole":
		return `{"model":"` + model + `",` + msgs + `,"mock":{"tps":100,"tokens":20}}`
	case "stop":
		return `{"model":"m1","stream":true,"stream_options":{"include_usage":true},` + msgs + `,"mock":{"tps":40,"tokens":600}}`
	case "abort":
		return `{"model":"m1","stream":true,` + msgs + `,"mock":{"tps":40,"tokens":200}}`
	}
	return `{"model":"` + model + `","stream":true,"stream_options":{"include_usage":true},` + msgs + `,"mock":{"tps":40,"tokens":40}}`
}

// traffic runs the clients.
type traffic struct {
	c      *cluster
	bases  []string // where clients send (the replicas, or a front)
	client *http.Client
	fault  func() string

	mu      sync.Mutex
	records []record
	sent    atomic.Int64
}

func (t *traffic) add(r record) {
	t.mu.Lock()
	t.records = append(t.records, r)
	t.mu.Unlock()
	t.sent.Add(1)
}

// run sends requests from workers until ctx ends; each request in flight
// then finishes (its own timeouts bound it).
func (t *traffic) run(ctx context.Context, workers int) {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			var ch *chatter
			for ctx.Err() == nil {
				kind := pickKind(rng)
				n := rng.IntN(len(t.bases))
				rec := record{Kind: kind, Replica: n, Fault: t.fault(), At: time.Now()}
				if strings.HasPrefix(kind, "chat") {
					if ch == nil {
						var err error
						if ch, err = t.signIn(t.c.chatEmails[w%len(t.c.chatEmails)]); err != nil {
							rec.Saw, rec.Detail = sawFailed, "sign-in: "+err.Error()
							t.add(rec)
							time.Sleep(time.Second)
							continue
						}
					}
					t.chat(ch, &rec, rng)
				} else {
					t.v1(&rec, rng)
				}
				rec.Dur = time.Since(rec.At).Seconds()
				t.add(rec)
				// A short think time keeps the offered load near what two cores carry.
				time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond)
			}
		}()
	}
	wg.Wait()
}

func (t *traffic) v1(rec *record, rng *rand.Rand) {
	base := t.bases[rec.Replica]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var aborted atomic.Bool
	if rec.Kind == "abort" {
		// The clock starts once the request is on the wire: from then on the
		// gateway has it and owes it a row whatever the client does.
		delay := time.Duration(100+rng.IntN(1500)) * time.Millisecond
		var once sync.Once
		var timer *time.Timer
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) {
			once.Do(func() { timer = time.AfterFunc(delay, func() { aborted.Store(true); cancel() }) })
		}})
		defer func() {
			if timer != nil {
				timer.Stop()
			}
		}()
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(v1Body(rec.Kind)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+t.c.key)
	rec.Sent = true
	resp, err := t.client.Do(req)
	if err != nil {
		if aborted.Load() {
			rec.Saw = sawAborted
		} else {
			rec.Saw, rec.Detail = sawFailed, err.Error()
		}
		return
	}
	defer resp.Body.Close()
	rec.Status = resp.StatusCode
	rec.ID = resp.Header.Get("X-Inference-Id")
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		rec.Saw, rec.Detail = sawError, string(b)
		return
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		_, err := io.ReadAll(resp.Body)
		switch {
		case aborted.Load():
			rec.Saw = sawAborted
		case err != nil:
			rec.Saw, rec.Detail = sawCut, err.Error()
		default:
			rec.Saw = sawComplete
		}
		return
	}
	br := bufio.NewReader(resp.Body)
	content, end, stopped := 0, sawCut, false
	for {
		line, err := br.ReadString('\n')
		switch {
		case strings.HasPrefix(line, "data: [DONE]"):
			if end != sawError {
				end = sawComplete
			}
		case strings.HasPrefix(line, `data: {"error"`):
			end, rec.Detail = sawError, strings.TrimSpace(line)
		case strings.HasPrefix(line, "data: ") && strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`):
			content++
			if rec.Kind == "stop" && content == 3 {
				// Stop through another replica: the owner hears of it across Redis.
				other := t.bases[(rec.Replica+1)%len(t.bases)]
				stopped = t.cancel(other, rec.ID)
			}
		}
		if err != nil {
			switch {
			case aborted.Load() && end == sawCut:
				rec.Saw = sawAborted
			case stopped && end != sawError:
				rec.Saw = sawStopped
			default:
				rec.Saw = end
				if end == sawCut && err != io.EOF {
					rec.Detail = err.Error()
				}
			}
			return
		}
	}
}

// cancel asks base to stop inference id; true when the answer says stopped.
func (t *traffic) cancel(base, id string) bool {
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/inferences/"+id+"/cancel", nil)
	req.Header.Set("Authorization", "Bearer "+t.c.key)
	c := http.Client{Timeout: 15 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var body struct{ State string }
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode == http.StatusOK && body.State == "stopped"
}

// chatter is a person signed in to the chat, with the CSRF token of their session.
type chatter struct {
	c    *http.Client
	csrf string
}

var reAuthRequestID = regexp.MustCompile(`name="authRequestID" value="([^"]*)"`)

// signIn signs email in through /login and the embedded provider's form.
func (t *traffic) signIn(email string) (*chatter, error) {
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	base := t.bases[0]
	resp, err := c.Get(base + "/login")
	if err != nil {
		return nil, err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := reAuthRequestID.FindSubmatch(body)
	if m == nil {
		return nil, fmt.Errorf("no sign-in form at %s (%d)", resp.Request.URL, resp.StatusCode)
	}
	resp, err = c.PostForm(base+"/idp/login", url.Values{"authRequestID": {html.UnescapeString(string(m[1]))},
		"email": {email}, "password": {chatPassword}})
	if err != nil {
		return nil, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	resp, err = c.Get(base + "/api/me")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var me struct {
		CSRFToken string `json:"csrf_token"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&me); err != nil || me.CSRFToken == "" {
		return nil, fmt.Errorf("/api/me: %d, no CSRF token (%v)", resp.StatusCode, err)
	}
	return &chatter{c: c, csrf: me.CSRFToken}, nil
}

func (ch *chatter) do(method, u, body string) (int, []byte, error) {
	req, _ := http.NewRequest(method, u, strings.NewReader(body))
	req.Header.Set("X-CSRF-Token", ch.csrf)
	req.Header.Set("Content-Type", "application/json")
	resp, err := ch.c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// chat is one answer on the chat page: a conversation, a message, maybe a
// Stop, then the saved message read back until it is no longer streaming.
func (t *traffic) chat(ch *chatter, rec *record, rng *rand.Rand) {
	base := t.bases[rec.Replica]
	status, body, err := ch.do(http.MethodPost, base+"/api/v1/conversations", `{"model":"m1"}`)
	if err != nil || status != http.StatusCreated {
		rec.Status, rec.Saw, rec.Detail = status, sawFailed, fmt.Sprintf("create conversation: %v %.200s", err, body)
		return
	}
	var conv struct{ ID string }
	_ = json.Unmarshal(body, &conv)
	rec.Sent = true
	status, body, err = ch.do(http.MethodPost, base+"/api/v1/conversations/"+conv.ID+"/messages", `{"content":"tell me a story"}`)
	rec.Status = status
	var sent struct {
		InferenceID string `json:"inference_id"`
	}
	_ = json.Unmarshal(body, &sent)
	rec.ID = sent.InferenceID
	if err != nil || status != http.StatusAccepted {
		rec.Saw, rec.Detail = sawError, fmt.Sprintf("send: %v %.200s", err, body)
		if err != nil && rec.ID == "" {
			rec.Saw = sawFailed
		}
		return
	}
	if rec.Kind == "chat_stop" {
		time.Sleep(time.Duration(200+rng.IntN(500)) * time.Millisecond)
		other := t.bases[(rec.Replica+1)%len(t.bases)]
		_, _, _ = ch.do(http.MethodPost, other+"/api/v1/inference/stop", `{"inference_id":"`+rec.ID+`"}`)
	}
	// The page shows the saved message once its stream ends: read it back
	// (from any replica) until it is no longer streaming.
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		status, body, err := ch.do(http.MethodGet, t.bases[rng.IntN(len(t.bases))]+"/api/v1/conversations/"+conv.ID, "")
		if err == nil && status == http.StatusOK {
			var c struct {
				Messages []struct {
					Status, Reason string
					InferenceID    string `json:"inference_id"`
				}
			}
			_ = json.Unmarshal(body, &c)
			for _, last := range c.Messages {
				if last.InferenceID != rec.ID || last.Status == "streaming" {
					continue
				}
				switch last.Status {
				case "done":
					rec.Saw = sawComplete
				case "stopped":
					rec.Saw = sawStopped
				default:
					rec.Saw, rec.Detail = sawError, last.Status+"/"+last.Reason
				}
				return
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	rec.Saw, rec.Detail = sawFailed, "the reply was still streaming after 2 minutes"
}
