# orderservice: `make run` serves on :8080 with the mock payment channel
# embedded; `make test` runs every test against a local PostgreSQL.

GO          ?= go
DATABASE_URL ?= postgres://postgres:postgres@localhost:5432/orderservice?sslmode=disable
export DATABASE_URL

# The version `orderservice version` prints: the commit, as git describes
# it ("-dirty" with uncommitted changes). `go run` stamps none of its own,
# and the image's build has no .git, so the builds here pass it by -ldflags.
# Without git (a source archive) nothing is stamped and the binary says
# "devel", or the revision Go recorded when it built it.
VERSION ?= $(shell git describe --always --dirty 2>/dev/null)
LDFLAGS := $(if $(VERSION),-X github.com/orderservice/orderservice/internal/app.version=$(VERSION))
BIN     ?= bin

.PHONY: help run migrate cleanup build image version test test-tools bench lint-openapi fmt vet

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 18

run: ## start the order service (and the embedded mock channel) on :8080
	$(GO) run -ldflags '$(LDFLAGS)' ./cmd/orderservice

migrate: ## apply the database migrations and exit
	$(GO) run -ldflags '$(LDFLAGS)' ./cmd/orderservice migrate

cleanup: ## one pass of the retention job by hand: delete expired records, archive money ones
	$(GO) run -ldflags '$(LDFLAGS)' ./cmd/orderservice cleanup

build: ## the image's four binaries in bin/ (BIN=dir: elsewhere), static and stamped with the version; a build of its own (for the CLI beside make run: go run ./cmd/orderservice help)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)' -o $(BIN)/ ./cmd/orderservice ./cmd/paymentchannel ./lab/cmd/lab ./cmd/healthcheck

image: ## the Docker image orderservice:local (the one compose runs), stamped with the version
	docker build --build-arg VERSION=$(or $(VERSION),devel) -t orderservice:local .

version: ## print the version the builds stamp
	@echo $(or $(VERSION),devel)

# What `make test` needs besides Go and PostgreSQL: Chromium for the lab's
# browser test and promtool for the alert rules' tests. Each fails, not
# skips, without them, so they are installed first when missing, as CI does.
TEST_TOOLS := chromium:chromium promtool:prometheus

test-tools: ## install what make test needs besides Go and PostgreSQL (chromium, promtool) when missing (apt-get: Debian, as root)
	@missing=""; for p in $(TEST_TOOLS); do command -v "$${p%%:*}" >/dev/null 2>&1 || missing="$$missing $${p#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  echo "test-tools: installing$$missing with apt-get"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$$missing >/dev/null; } || \
	  { echo "test-tools: could not install$$missing; install it yourself (Debian's packages:$$missing)"; exit 1; }; \
	fi

test: test-tools ## every test, with the race detector, against real PostgreSQL (installs chromium and promtool first when missing)
	$(GO) vet ./...
	$(GO) test -race -count=1 -p 4 -timeout 8m ./...

.PHONY: test-faults
test-faults: ## fault and load suite on real processes (restarts the local PostgreSQL: run it alone); FAULTS_FLAGS=-short for the reduced run CI makes
	$(GO) vet -tags faults ./tests/faults/...
	$(GO) test -race -tags faults -count=1 -timeout 15m $(FAULTS_FLAGS) ./tests/faults/...

# HA_PACKAGES are what the HA suite runs on: Patroni, etcd and PostgreSQL 15
# (Debian's packages), installed when missing. CI runs as root on a fresh machine.
HA_PACKAGES := patroni:patroni etcd:etcd-server etcdctl:etcd-client /usr/lib/postgresql/15/bin/postgres:postgresql-15

.PHONY: test-ha
test-ha: ## HA suite: etcd and two Patroni-managed PostgreSQL 15 nodes on loopback; a primary killed mid-storm, an unknown commit, a switchover, a start with only the replica (installs patroni, etcd-server, etcd-client when missing)
	@missing=""; for p in $(HA_PACKAGES); do command -v "$${p%%:*}" >/dev/null 2>&1 || missing="$$missing $${p#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  echo "test-ha: installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null || exit 1; \
	fi
	$(GO) vet -tags ha ./tests/hatest/...
	@dir=$$(mktemp -d /tmp/orderservice-ha-XXXXXX); \
	trap 'sh tests/hatest/leftovers.sh "$$dir"' EXIT INT TERM; \
	HA_DIR=$$dir $(GO) test -race -tags ha -count=1 -timeout 4m -v ./tests/hatest/...

.PHONY: test-bursts
test-bursts: ## the seed's storms on an idle instance with the default admission settings: served, not shed (run alone)
	$(GO) vet -tags bursts ./internal/order/...
	$(GO) test -tags bursts -count=1 -v -run TestBurstsAreServedNotShed ./internal/order/

.PHONY: test-cluster
test-cluster: ## broker suite: a 3-node JetStream cluster on loopback (nats-server built from the module), two instances, a node SIGKILLed mid-backlog
	$(GO) vet -tags cluster ./internal/messaging/...
	$(GO) test -race -tags cluster -count=1 -timeout 8m -v -run TestCommandsConvergeWhenABrokerNodeDies ./internal/messaging/

.PHONY: model
model: ## model-check the idempotency protocol with SPIN (installs spin when missing): it holds; each safeguard removed, it fails; then the traced order tests' runs are replayed against it (needs PostgreSQL)
	bash model/check.sh

.PHONY: seedbugs
seedbugs: ## seed seven bugs into a copy of the tree, one at a time: which the trace check rejects, which the Go tests catch (minutes a bug)
	bash model/seedbugs.sh

# The demo and the lab talk to a running service: `make run` first, or
# `docker compose up` and then `make demo STACK=compose`. Each reads its
# settings from DEMO_* and LAB_* (docs/lab.md lists them), e.g.
# `make demo DEMO_SERVICE_URL=http://host:8080 DEMO_FLAGS="-only 9,11"`.
ifeq ($(STACK),compose)
# compose serves the same ports (or where its ORDERSERVICE_*_PORT variables
# moved them), but its NATS on 4222 with its own secret.
ORDERSERVICE_API_PORT      ?= 8080
ORDERSERVICE_CHANNEL_PORT  ?= 8081
ORDERSERVICE_NATS_PORT     ?= 4222
ORDERSERVICE_POSTGRES_PORT ?= 15432
export DEMO_SERVICE_URL   ?= http://localhost:$(ORDERSERVICE_API_PORT)
export DEMO_CHANNEL_URL   ?= http://127.0.0.1:$(ORDERSERVICE_CHANNEL_PORT)
export DEMO_NATS_URL      ?= nats://127.0.0.1:$(ORDERSERVICE_NATS_PORT)
export DEMO_NATS_OPERATOR ?= orderservice:orderservice-compose-secret
export LAB_SERVICE_URL    ?= $(DEMO_SERVICE_URL)
export LAB_CHANNEL_URL    ?= $(DEMO_CHANNEL_URL)
export LAB_NATS_URL       ?= $(DEMO_NATS_URL)
export LAB_NATS_OPERATOR  ?= $(DEMO_NATS_OPERATOR)
# The pitfall lessons' naive service runs in the demo's process, against
# compose's PostgreSQL (published on loopback 15432, password postgres).
export DEMO_NAIVE_DATABASE_URL ?= postgres://postgres:postgres@127.0.0.1:$(ORDERSERVICE_POSTGRES_PORT)/naiveorders?sslmode=disable
export LAB_NAIVE_DATABASE_URL  ?= $(DEMO_NAIVE_DATABASE_URL)
endif

.PHONY: demo
demo: ## narrated scenarios of every lesson against the running service (STACK=compose: against docker compose up)
	$(GO) run ./lab/cmd/demo $(DEMO_FLAGS)

.PHONY: lab
lab: ## the lessons in a browser on http://localhost:8090, against the running service (STACK=compose: against docker compose up)
	$(GO) run ./lab/cmd/lab $(LAB_FLAGS)

.PHONY: lab-screenshot
lab-screenshot: ## run the lab's browser test and refresh docs/lab.png, the README's picture
	LAB_SCREENSHOT=update $(GO) test -count=1 -run TestLabInABrowser ./lab/cmd/lab/

bench: ## load benchmarks against the real service and PostgreSQL; writes docs/benchmarks/ (BENCHFLAGS=-quick: a short run, written outside the tree)
	$(GO) run ./tests/bench $(BENCHFLAGS)

lint-openapi: ## lint api/openapi.yaml (Redocly; Spectral with OWASP's ruleset, 0 errors) and build a client from it with ogen, oapi-codegen and openapi-typescript
	npm ci --prefix tools/openapi-lint --no-audit --no-fund
	npx --prefix tools/openapi-lint redocly lint --config api/redocly.yaml api/openapi.yaml
	cd tools/openapi-lint && npx spectral lint --ruleset spectral.yaml --fail-severity error --display-only-failures ../../api/openapi.yaml
	cd tools/openapi-lint && npx spectral lint --ruleset spectral.yaml --quiet -f json ../../api/openapi.yaml | node warnings.mjs ../../docs/api-lint.md
	bash tools/openapi-gen/check.sh

fmt: ## gofmt every Go file
	gofmt -w $$(git ls-files '*.go')

vet: ## go vet every package, the tagged suites included
	$(GO) vet ./...
	$(GO) vet -tags faults ./tests/faults/...
	$(GO) vet -tags ha ./tests/hatest/...
	$(GO) vet -tags bursts ./internal/order/...
	$(GO) vet -tags cluster ./internal/messaging/...
