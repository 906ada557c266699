// Command floorproxy is a reverse proxy with nothing in it: every request
// goes to one upstream and its answer comes back, streamed as it arrives.
// It is the floor for any Go gateway on the machine it runs on, measured in
// the same sitting as nginx and Moonji (bench/bench-overhead.sh with
// ONLY=floor, bench/bench-seq.sh): what Go's runtime and an HTTP stack
// cost before a gateway does anything of its own.
//
//	floorproxy [-listen ADDR] [-upstream HOST:PORT] [-stack fasthttp|nethttp]
//
// fasthttp is the stack Moonji serves with (under Fiber); nethttp is the
// standard library's httputil.ReverseProxy. FLOORPROXY_STACK sets the stack
// when the flag is not given.
//
// It also answers what the bench scripts ask of a moonji binary, so that it
// can stand in for one: "keys create ..." prints a key nobody checks,
// "serve --config FILE" listens on FILE's listen address and forwards to
// its first backend's host, and GET /healthz is answered by the proxy.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"

	"github.com/valyala/fasthttp"

	"moonji/internal/config"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "keys" {
		fmt.Println("floorproxy-checks-no-key")
		return
	}
	listen, upstream := "127.0.0.1:18092", "127.0.0.1:18080"
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		var err error
		listen, upstream, err = fromConfig(os.Args[2:])
		if err != nil {
			log.Fatal(err)
		}
		os.Args = os.Args[:1]
	}
	stack := os.Getenv("FLOORPROXY_STACK")
	if stack == "" {
		stack = "fasthttp"
	}
	flag.StringVar(&listen, "listen", listen, "address to listen on")
	flag.StringVar(&upstream, "upstream", upstream, "upstream host:port")
	flag.StringVar(&stack, "stack", stack, "fasthttp | nethttp")
	flag.Parse()
	switch stack {
	case "fasthttp":
		s := &fasthttp.Server{Handler: fastProxy(upstream), StreamRequestBody: true}
		log.Fatal(s.ListenAndServe(listen))
	case "nethttp":
		u := &url.URL{Scheme: "http", Host: upstream}
		rp := httputil.NewSingleHostReverseProxy(u)
		rp.FlushInterval = -1 // flush every write: server-sent events
		mux := http.NewServeMux()
		mux.Handle("/", rp)
		mux.HandleFunc("GET /healthz", func(http.ResponseWriter, *http.Request) {})
		log.Fatal(http.ListenAndServe(listen, mux))
	default:
		log.Fatalf("unknown stack %q", stack)
	}
}

// fastProxy forwards a request with fasthttp's client and streams the
// answer back through fasthttp's server, which flushes after each read.
func fastProxy(upstream string) fasthttp.RequestHandler {
	c := &fasthttp.HostClient{Addr: upstream, StreamResponseBody: true, MaxConns: 4096}
	return func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/healthz" {
			return // 200, empty
		}
		ctx.Request.SetHost(upstream)
		resp := fasthttp.AcquireResponse()
		if err := c.Do(&ctx.Request, resp); err != nil {
			fasthttp.ReleaseResponse(resp)
			ctx.Error(err.Error(), fasthttp.StatusBadGateway)
			return
		}
		ctx.SetStatusCode(resp.StatusCode())
		ctx.Response.Header.SetContentTypeBytes(resp.Header.ContentType())
		ctx.SetBodyStream(&answer{r: resp.BodyStream(), resp: resp}, resp.Header.ContentLength())
	}
}

// answer is an upstream answer's body; closing it gives the upstream
// connection back.
type answer struct {
	r    io.Reader
	resp *fasthttp.Response
}

func (a *answer) Read(p []byte) (int, error) { return a.r.Read(p) }

func (a *answer) Close() error {
	err := a.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(a.resp)
	return err
}

// fromConfig reads the listen address and the first backend's host from a
// moonji config file (--config FILE), with moonji's own loader.
func fromConfig(args []string) (listen, upstream string, err error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	path := fs.String("config", "", "moonji config file")
	if err := fs.Parse(args); err != nil {
		return "", "", err
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return "", "", err
	}
	if len(cfg.Backends) == 0 || cfg.Backends[0].URL == "" {
		return "", "", fmt.Errorf("%s: no backend with a url", *path)
	}
	u, err := url.Parse(cfg.Backends[0].URL)
	if err != nil {
		return "", "", fmt.Errorf("%s: backend url: %w", *path, err)
	}
	return cfg.Listen, u.Host, nil
}
