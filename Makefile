# Two commands matter: `go run . serve` (the README) and `make test`, which
# installs what the tests need and runs all of them.
GO      ?= go
BIN     := bin/moonji
# The race detector needs cgo and a C compiler; without one the tests still
# run, without it.
RACE    := $(shell command -v gcc >/dev/null 2>&1 && echo -race)

.PHONY: all build run test deps test-go test-image test-e2e test-engine generate bench clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -o $(BIN) .

run:
	$(GO) run . serve

generate:
	cd views && $(GO) tool templ generate -path .

test: deps build test-go test-image test-e2e

deps: node_modules/.installed
	@scripts/ensure-chromium.sh
	@scripts/ensure-nginx.sh
	@scripts/ensure-jaeger.sh >/dev/null

node_modules/.installed: package.json package-lock.json
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund
	@touch $@

# Every Go test runs once, under the race detector when a C compiler is
# there: the gateway is all goroutines (streams, stops, the ledger writer,
# watchers). The darwin build and vet keep `go run . serve` working on a Mac;
# vetting with the bench tag keeps the benchmark harnesses compiling. web's
# suite takes 14-18 minutes under -race on two busy cores (its fault tests
# wait out real outages): the limit is 30 minutes, so that a loaded machine
# is slow rather than red.
test-go:
	$(GO) vet ./...
	$(GO) vet -tags bench ./...
	GOOS=darwin GOARCH=arm64 $(GO) build ./...
	GOOS=darwin GOARCH=arm64 $(GO) vet ./...
	$(GO) test -count=1 -timeout 30m $(RACE) ./...

# The Dockerfile is not built here (no Docker daemon): its build line is run
# as written and the binary started as the image's non-root user with the
# image's ENV, and must answer /healthz and /readyz.
test-image:
	scripts/test-image.sh

test-e2e: build node_modules/.installed
	npx playwright test

# The SDK e2e suite against a real engine: Ollama v0.17.4, built from the Go
# module proxy once per machine (cached in /tmp/realengine), serving the tiny
# model in ../shared/models/ (MOONJI_SHARED overrides ../shared).
test-engine: deps build
	scripts/test-engine.sh

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./internal/proxy/ ./internal/stop/ ./internal/admission/ ./internal/ratelimit/

clean:
	rm -rf bin e2e/.tmp test-results
