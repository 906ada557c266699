package mockllm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
)

// replay writes the recorded file named by the replay knob byte for byte.
// A ".sse" file is written frame by frame (each flushed, paced like tokens);
// anything else is written at once. A sibling "<name without ext>.headers"
// file, as captured by curl -D, supplies the status and Content-Type.
func (s *Server) replay(ctx context.Context, w http.ResponseWriter, rec *Record, k knobs) {
	name := k.replay
	if s.opts.ReplayDir == "" {
		s.fail(w, rec, http.StatusInternalServerError, "server_error",
			fmt.Sprintf("mock.replay %q asked but the mock has no replay directory", name))
		return
	}
	// os.Root keeps a request from reading outside ReplayDir ("../../etc/passwd").
	root, err := os.OpenRoot(s.opts.ReplayDir)
	if err != nil {
		s.fail(w, rec, http.StatusInternalServerError, "server_error", fmt.Sprintf("opening replay directory: %v", err))
		return
	}
	defer root.Close()
	data, err := root.ReadFile(name)
	if err != nil {
		s.fail(w, rec, http.StatusInternalServerError, "server_error", fmt.Sprintf("reading replay %q: %v", name, err))
		return
	}

	isSSE := strings.HasSuffix(name, ".sse")
	status, ctype := http.StatusOK, "application/json"
	if isSSE {
		ctype = "text/event-stream"
	}
	headersName := strings.TrimSuffix(name, path.Ext(name)) + ".headers"
	if hdr, err := root.ReadFile(headersName); err == nil {
		st, ct, perr := parseHeadersFile(hdr)
		if perr != nil {
			s.fail(w, rec, http.StatusInternalServerError, "server_error", fmt.Sprintf("replay %q: %v", headersName, perr))
			return
		}
		status = st
		if ct != "" {
			ctype = ct
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		s.fail(w, rec, http.StatusInternalServerError, "server_error", fmt.Sprintf("reading replay %q: %v", headersName, err))
		return
	}
	s.log.Info("replaying recording", "tag", rec.Tag, "file", name, "status", status, "bytes", len(data))

	w.Header().Set("Content-Type", ctype)
	if !isSSE {
		if err := writeJSONLike(w, status, data); err != nil {
			s.cancelled(rec, "replay", err)
			return
		}
		s.update(rec, func(r *Record) { r.Status = status })
		s.completed(rec)
		return
	}

	rc := http.NewResponseController(w)
	w.WriteHeader(status)
	s.update(rec, func(r *Record) { r.Status = status })
	if err := rc.Flush(); err != nil {
		s.cancelled(rec, "headers", err)
		return
	}
	pace := s.pacing(k)
	for i, frame := range splitFrames(data) {
		if i == k.disconnectAfter {
			s.abort(rec)
		}
		if !waitUntil(ctx, pace.due(rec.Started, i+1)) {
			s.cancelled(rec, "replay", context.Cause(ctx))
			return
		}
		if _, err := w.Write(frame); err != nil {
			s.cancelled(rec, "replay", fmt.Errorf("writing replay frame: %w", err))
			return
		}
		if err := rc.Flush(); err != nil {
			s.cancelled(rec, "replay", fmt.Errorf("flushing replay frame: %w", err))
			return
		}
		s.update(rec, func(r *Record) { r.ChunksSent = i + 1 })
	}
	s.completed(rec)
}

// writeJSONLike writes a whole recorded body with the Content-Type already set.
func writeJSONLike(w http.ResponseWriter, status int, body []byte) error {
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	if _, err := w.Write(body); err != nil {
		return fmt.Errorf("writing replay body: %w", err)
	}
	return nil
}

// splitFrames cuts an SSE recording after each blank line ("\n\n"); a
// trailing piece without one is kept, so the frames always concatenate back
// to the input.
func splitFrames(data []byte) [][]byte {
	var frames [][]byte
	for len(data) > 0 {
		i := bytes.Index(data, []byte("\n\n"))
		if i < 0 {
			frames = append(frames, data)
			break
		}
		frames = append(frames, data[:i+2])
		data = data[i+2:]
	}
	return frames
}

// parseHeadersFile reads a curl -D dump: the status line, then headers.
func parseHeadersFile(b []byte) (status int, contentType string, err error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	if !sc.Scan() {
		return 0, "", fmt.Errorf("empty headers file: %w", io.ErrUnexpectedEOF)
	}
	// "HTTP/1.1 404 Not Found"
	fields := strings.Fields(sc.Text())
	if len(fields) < 2 {
		return 0, "", fmt.Errorf("bad status line %q", sc.Text())
	}
	status, err = strconv.Atoi(fields[1])
	if err != nil || status < 100 || status > 999 {
		return 0, "", fmt.Errorf("bad status line %q", sc.Text())
	}
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.EqualFold(strings.TrimSpace(k), "Content-Type") {
			contentType = strings.TrimSpace(v)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, "", fmt.Errorf("reading headers file: %w", err)
	}
	return status, contentType, nil
}
