# orderservice: `make run` serves on :8080 with the mock payment channel
# embedded; `make test` runs every test against a local PostgreSQL.

GO          ?= go
DATABASE_URL ?= postgres://postgres:postgres@localhost:5432/orderservice?sslmode=disable
export DATABASE_URL

.PHONY: run migrate cleanup test test-short bench lint-openapi fmt vet

run: ## start the order service (and the embedded mock channel) on :8080
	$(GO) run ./cmd/orderservice

migrate: ## apply the database migrations and exit
	$(GO) run ./cmd/orderservice migrate

cleanup: ## one pass of the retention job by hand: delete expired records, archive money ones
	$(GO) run ./cmd/orderservice cleanup

test: ## every test, with the race detector, against real PostgreSQL
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 8m ./...

.PHONY: test-faults
test-faults: ## fault and load suite on real processes (restarts the local PostgreSQL: run it alone); FAULTS_FLAGS=-short for the reduced run CI makes
	$(GO) vet -tags faults ./internal/faults/...
	$(GO) test -race -tags faults -count=1 -timeout 15m $(FAULTS_FLAGS) ./internal/faults/...

# The demo talks to a running service: `make run` (or `docker compose up`)
# first. Override e.g. `make demo DEMO_BASE_URL=http://host:8080`.
DEMO_BASE_URL    ?= http://localhost:8080
DEMO_CHANNEL_URL ?= http://localhost:8081
DEMO_API_KEY     ?= demo-key-acme

.PHONY: demo
demo: ## narrated scenarios of every lesson against the running service
	$(GO) run ./cmd/demo -url $(DEMO_BASE_URL) -channel $(DEMO_CHANNEL_URL) -api-key $(DEMO_API_KEY)

bench: ## load benchmarks against the real service and PostgreSQL; writes docs/benchmarks/ (BENCHFLAGS=-quick for a short run)
	$(GO) run ./cmd/bench $(BENCHFLAGS)

lint-openapi: ## lint api/openapi.yaml with Redocly
	npm ci --prefix tools/openapi-lint --no-audit --no-fund
	npx --prefix tools/openapi-lint redocly lint --config api/redocly.yaml api/openapi.yaml

fmt:
	gofmt -w $$(git ls-files '*.go')
