// Package proxy is the engine side of the gateway: the OpenAI APIs it
// serves (api.go), the request body read and patched as raw JSON (body.go:
// only model, stream and stream_options are read or set, everything else
// passes through untouched — vLLM's chat_template_kwargs, explicit nulls,
// fields nobody knows yet), the HTTP/1.1 client that calls engines
// (client.go, transport.go, response.go), and the relay that hands a
// streamed answer to the client frame by frame, byte for byte (relay.go;
// one server-sent event may be at most 4 MiB).
//
// # The engine client
//
// Client is an HTTP/1.1 client of Moonji's own rather than net/http's
// Transport: it holds no goroutine and no write buffer per connection, and
// keeps none of an answer's headers but one, so that an open stream costs
// little memory. Its parser of engines' answers is fuzzed against net/http's
// (FuzzReadResponse). It does what an engine call needs and no more:
//
//   - Base URLs are http:// or https:// with a host; the port defaults to 80
//     or 443, and the path is kept as a prefix. A base URL's user info, query
//     and fragment are ignored: the API key is the only credential sent.
//   - Requests: POST with a JSON body, or GET and DELETE without one. The
//     headers are Host, User-Agent: moonji, Content-Type: application/json,
//     Accept: application/json, text/event-stream, Authorization: Bearer
//     with the backend's key (when it has one), and Content-Length. The body
//     is written whole from memory, with its length: never chunked, no
//     Expect: 100-continue, no Accept-Encoding (engines answer uncompressed;
//     a Content-Encoding is not read nor undone). A path or key holding a
//     space or a control character is refused before anything is sent.
//   - The request is written before its answer is read, on the caller's
//     goroutine. An engine that answers before it has read the whole request
//     and then closes (a 413 to a large body) fails the request with the
//     write's error rather than its answer.
//   - Answers: HTTP/1.1 or HTTP/1.0. The status line and headers, interim
//     1xx answers included, may take at most 1 MiB; interim answers (103
//     Early Hints, an unasked 100) are skipped. Of the headers only
//     Content-Type (its first value) is kept; Content-Length,
//     Transfer-Encoding and Connection are read to frame the body and the
//     rest is discarded. A body is framed by chunked encoding (its trailers,
//     at most 3 KiB, read and discarded), by Content-Length, or by the end
//     of the connection. Refused as malformed, as net/http refuses them: a
//     bad status line or header, a Transfer-Encoding other than chunked,
//     Content-Lengths that disagree, a chunked HTTP/1.0 answer; and, where
//     net/http would join them, headers folded over lines.
//   - Not supported: HTTP/2 and HTTP/3 (TLS's ALPN offers http/1.1 alone, so
//     an engine that speaks both answers in HTTP/1.1; no h2c); proxies
//     (HTTP_PROXY, HTTPS_PROXY and NO_PROXY are ignored, engines are dialled
//     directly); redirects (a 3xx is the engine's answer, not followed);
//     cookies; Unix sockets.
//   - TLS: crypto/tls's defaults (TLS 1.2 or later), SNI with the URL's host
//     name (none for an IP address), the engine's certificate verified for
//     that host against the
//     system's roots or, for a backend with a ca_file, against that file's
//     certificates alone (Upstream.RootCAs, LoadCAFile). No client
//     certificate, no way to skip verification, no session resumption.
//   - Timeouts: resolving the host and connecting take at most 5 s; nothing
//     else has a timeout of its own. The TLS handshake, writing the request,
//     waiting for the answer and reading its body last as long as the
//     request's context: cancelling it (the backend's timeout, a client that
//     left, a stop) closes the connection at once, through
//     context.AfterFunc. TCP keep-alive probes start after 30 s of silence.
//   - Connections are pooled per engine (scheme, host and port, and its
//     ca_file's certificates when it has one): at most 256 idle connections
//     per engine and 1024 in all, an idle connection closed after 90 s, the
//     most recently used taken first. Open connections are not capped here:
//     a backend's max_concurrency bounds them. A connection goes back to the
//     pool only when its answer was read to its end and was framed by length
//     or chunks, and the engine did not ask to close it. A body closed
//     before its end closes the connection (how the engine learns its client
//     left), unless what is left of it, at most 256 bytes, has already
//     arrived; or unless it is a stream whose last event was read and only
//     the chunked body's end is late: that end is read when the connection
//     is next taken, waiting at most 1 ms for it (CloseAnswer). A
//     connection's read buffer is 512 bytes, for status lines, headers and
//     chunk sizes; a body is read straight into the caller's larger buffer.
//   - A request that fails before any answer on a kept connection the
//     engine had closed while it sat idle (end of file, reset, broken pipe)
//     is sent once more on a new connection; no other request is retried.
//   - A failure to reach the engine or to read its answer's header is an
//     *UpstreamError (status 502, or 504 for a timeout); a request whose
//     context ended returns the context's error.
package proxy
