package web_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// jaegerBinary builds Jaeger once (scripts/ensure-jaeger.sh, which `make
// deps` runs) and returns its path. Outside CI a build that fails skips
// the test, saying why; in CI it fails it.
func jaegerBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("MOONJI_JAEGER_BIN"); p != "" {
		return p
	}
	// The first build takes minutes (make deps does it ahead); it gives up
	// in time for the test to say why rather than be killed by go test.
	deadline := time.Now().Add(20 * time.Minute)
	if d, ok := t.Deadline(); ok {
		deadline = d.Add(-90 * time.Second)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, "../scripts/ensure-jaeger.sh")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err == nil {
		return strings.TrimSpace(string(out))
	}
	msg := fmt.Sprintf("jaeger could not be built (scripts/ensure-jaeger.sh): %v\n%s", err, stderr.String())
	if os.Getenv("CI") != "" || os.Getenv("MOONJI_TEST_POSTGRES_DSN") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// jaegerConfig runs Jaeger v2's all-in-one pieces on ports of the test's
// own: the OTLP/HTTP receiver, in-memory storage, and the query service
// (HTTP API for the test, gRPC only because it listens anyway). No
// telemetry of its own: its metrics' default port would clash.
const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`

// startJaeger runs Jaeger until the test ends and returns its OTLP/HTTP
// base URL and its query API's base URL, once both answer.
func startJaeger(t *testing.T) (otlp, query string) {
	t.Helper()
	bin := jaegerBinary(t)
	queryPort, grpcPort, otlpPort := freePort(t), freePort(t), freePort(t)
	cfgPath := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, jaegerConfig, queryPort, grpcPort, otlpPort), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", cfgPath)
	logs, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var tail []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(logs)
		for sc.Scan() {
			if len(tail) < 200 {
				tail = append(tail, sc.Text())
			}
		}
	}()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start jaeger: %v", err)
	}
	exited := make(chan error, 1)
	go func() { <-done; exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	otlp = fmt.Sprintf("http://127.0.0.1:%d", otlpPort)
	query = fmt.Sprintf("http://127.0.0.1:%d", queryPort)
	up := func(url string) bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	}
	waitFor(t, "jaeger's query API and OTLP receiver answer", 60*time.Second, func() bool {
		select {
		case err := <-exited:
			t.Fatalf("jaeger exited: %v\n%s", err, strings.Join(tail, "\n"))
		default:
		}
		return up(query+"/api/services") && up(otlp+"/v1/traces")
	}, func() { t.Logf("jaeger's log:\n%s", strings.Join(tail, "\n")) })
	return otlp, query
}

// jaegerTrace is a trace as Jaeger's query API (/api/traces/{id}) returns it.
type jaegerTrace struct {
	TraceID string `json:"traceID"`
	Spans   []struct {
		TraceID       string `json:"traceID"`
		SpanID        string `json:"spanID"`
		OperationName string `json:"operationName"`
		References    []struct {
			RefType string `json:"refType"`
			TraceID string `json:"traceID"`
			SpanID  string `json:"spanID"`
		} `json:"references"`
		Tags []struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		} `json:"tags"`
		ProcessID string `json:"processID"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

// fetchTrace asks Jaeger for trace id: the trace and the raw answer, or
// nil while Jaeger does not have it (or has fewer than want spans).
func fetchTrace(t *testing.T, query, id string, want int) (*jaegerTrace, string) {
	t.Helper()
	resp, err := http.Get(query + "/api/traces/" + id)
	if err != nil {
		return nil, ""
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, ""
	}
	var out struct {
		Data []jaegerTrace `json:"data"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("jaeger's answer: %v: %s", err, raw)
	}
	if len(out.Data) != 1 || len(out.Data[0].Spans) < want {
		return nil, ""
	}
	return &out.Data[0], string(raw)
}
