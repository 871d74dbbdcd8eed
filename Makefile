# Parley developer tasks. `make` alone lists them.
#
# The tests use a real PostgreSQL and Redis, set up by `make services`
# (tools/ensure-services.sh: Debian packages, the packaged PostgreSQL cluster,
# a redis-server on 127.0.0.1:6379). To use servers of your own instead, set
# PARLEY_TEST_POSTGRES_URL / PARLEY_TEST_REDIS_URL (tests) or
# PARLEY_POSTGRES_URL / PARLEY_REDIS_URL (parleyd); the script then leaves
# that service alone.

SHELL := /bin/bash
GO ?= go
# The official Go tarball installs to /usr/local/go/bin, often not on PATH.
export PATH := $(PATH):/usr/local/go/bin

PARLEY_TEST_POSTGRES_URL ?= postgres://parley:parley@127.0.0.1:5432/parley?sslmode=disable
PARLEY_TEST_REDIS_URL ?= redis://127.0.0.1:6379/0
TEST_ENV = PARLEY_TEST_POSTGRES_URL='$(PARLEY_TEST_POSTGRES_URL)' PARLEY_TEST_REDIS_URL='$(PARLEY_TEST_REDIS_URL)'

.DEFAULT_GOAL := help

help: ## Show this help
	@echo "Usage: make TARGET. Targets:"
	@grep -hE '^[0-9a-zA-Z_-]+:.*?## .*$$' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-13s %s\n", $$1, $$2}'
.PHONY: help

services: ## Install (apt), start and set up PostgreSQL and Redis for parleyd and the tests
	@bash tools/ensure-services.sh
.PHONY: services

run: services ## Run parleyd (config from PARLEY_* env vars; defaults use the local services)
	$(GO) run ./cmd/parleyd
.PHONY: run

build: ## Build every package
	$(GO) build ./...
.PHONY: build

test: services ## Vet, run all tests with -race against real PostgreSQL and Redis, then fuzz the wire decoder (300,000 inputs), the PROXY header and WebSocket frame parsers (15,000 each)
	# vet with -race: it type-checks against the same race-instrumented
	# builds of the packages and their dependencies that the tests then
	# reuse, instead of compiling everything a second time.
	$(GO) vet -race ./...
	# ./test/e2e first: its tests are the longest, and go test starts
	# packages in the order given, so the others run beside it. Tests that
	# mostly wait run in parallel (t.Parallel), three at a time; those that
	# measure the whole process (heap, goroutines, pace) or a timing of
	# their own run alone. -vet=off: go vet above checked every package,
	# its tests included, with all of its analyzers.
	$(TEST_ENV) $(GO) test -race -vet=off -count=1 -parallel 3 -timeout 9m ./test/e2e/ $$($(GO) list ./... | grep -v '/test/e2e$$')
	# The fuzzing runs after the tests, not beside them: run beside them
	# (even niced) it slowed the tests that time themselves on two cores.
	# Budgets in inputs, not seconds: with a duration, Go before 1.27 can
	# report "context deadline exceeded" as a failure when the time runs out
	# while a worker is busy (a race in the fuzzing coordinator).
	$(GO) test ./wire -run '^$$' -fuzz FuzzDecodeRequest -fuzztime 300000x
	$(GO) test ./conn/proxyheader -run '^$$' -fuzz FuzzProxyHeader -fuzztime 15000x
	$(GO) test ./conn/wsframe -run '^$$' -fuzz FuzzWSFrames -fuzztime 15000x
.PHONY: test

test-browser: services ## Run the browser demo (web/) in headless Chromium, installed on demand: two pages exchange messages
	$(TEST_ENV) $(GO) test -tags browser -count=1 -timeout 5m ./web/ -run TestBrowser
.PHONY: test-browser

web: ## Serve the browser demo on http://127.0.0.1:8080 (point it at parleyd's ws_listen)
	$(GO) run ./cmd/parley-web
.PHONY: web

MSGPACK_JS_VERSION ?= 3.1.3

web-vendor: ## Fetch @msgpack/msgpack from npm into web/vendor/ (the page loads nothing from elsewhere)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	(cd "$$tmp" && npm pack --silent @msgpack/msgpack@$(MSGPACK_JS_VERSION) >/dev/null && tar xzf msgpack-msgpack-$(MSGPACK_JS_VERSION).tgz) && \
	cp "$$tmp/package/dist.umd/msgpack.min.js" web/vendor/msgpack.min.js && \
	cp "$$tmp/package/LICENSE" web/vendor/msgpack.LICENSE && \
	echo "web/vendor: @msgpack/msgpack $(MSGPACK_JS_VERSION)"
.PHONY: web-vendor

# A private 6-node Redis Cluster on 127.0.0.1:$(CLUSTER_PORT)…+5 (bus: port+10000).
CLUSTER_PORT ?= 7101

test-cluster: services ## Run the server tests with a 6-node Redis Cluster (redis_cluster) as their hot store
	@seeds=$$(bash tools/redis-cluster.sh start $(CLUSTER_PORT)) && \
	trap 'bash tools/redis-cluster.sh stop $(CLUSTER_PORT)' EXIT && \
	echo "PARLEY_TEST_REDIS_CLUSTER=$$seeds" && \
	$(TEST_ENV) PARLEY_TEST_REDIS_CLUSTER="$$seeds" $(GO) test -race -count=1 -timeout 9m ./test/e2e/
.PHONY: test-cluster

bench: services ## Run the standard benchmark suite (about 10 minutes) and write BENCHMARKS.md
	$(TEST_ENV) bash tools/bench.sh
.PHONY: bench

fmt: ## Format the Go code (gofmt -s)
	gofmt -s -w $$(find . -name '*.go' -not -path './.git/*')
.PHONY: fmt

clean: ## Remove build outputs and Go's test cache
	rm -rf bin/
	$(GO) clean -testcache
.PHONY: clean
