# orderservice: `make run` serves on :8080 with the mock payment channel
# embedded; `make test` runs every test against a local PostgreSQL.

GO          ?= go
DATABASE_URL ?= postgres://postgres:postgres@localhost:5432/orderservice?sslmode=disable
export DATABASE_URL

.PHONY: run migrate test test-short bench lint-openapi fmt vet

run: ## start the order service (and the embedded mock channel) on :8080
	$(GO) run ./cmd/orderservice

migrate: ## apply the database migrations and exit
	$(GO) run ./cmd/orderservice migrate

test: ## every test, with the race detector, against real PostgreSQL
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 8m ./...

bench: ## load benchmarks against the real service and PostgreSQL
	$(GO) run ./cmd/bench

lint-openapi: ## lint api/openapi.yaml with Redocly
	npm ci --prefix tools/openapi-lint --no-audit --no-fund
	npx --prefix tools/openapi-lint redocly lint --config api/redocly.yaml api/openapi.yaml

fmt:
	gofmt -w $$(git ls-files '*.go')
