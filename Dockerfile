# syntax=docker/dockerfile:1

# One image, five static binaries: the order service (default), the mock
# payment channel (compose sets entrypoint /paymentchannel), the lab (the
# lessons in a browser; entrypoint /lab), the health probe that compose's
# healthchecks run, since distroless has no shell or curl, and the NATS
# server (entrypoint /nats-server), built from the nats-server module at
# go.mod's version: the very server every test embeds, so compose's broker
# is the one the tests prove.

# Matches go.mod's go line; the official image sets GOTOOLCHAIN=local, so an
# older Go here would fail the build rather than download a toolchain.
ARG GO_VERSION=1.26.8
# The version `orderservice version` prints. .git is not in the build
# context, so the build cannot ask git: `make image` passes
# --build-arg VERSION=$(git describe --always --dirty), and compose passes
# $VERSION when it is set. Without it the image says "devel".
ARG VERSION=devel

FROM golang:${GO_VERSION}-bookworm AS build
ARG VERSION
WORKDIR /src

# Modules first: this layer is rebuilt only when go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download

COPY . .
ENV CGO_ENABLED=0
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags="-s -w -X github.com/orderservice/orderservice/internal/app.version=${VERSION}" -o /out/orderservice ./cmd/orderservice && \
    go build -trimpath -ldflags='-s -w' -o /out/paymentchannel ./cmd/paymentchannel && \
    go build -trimpath -ldflags='-s -w' -o /out/lab ./lab/cmd/lab && \
    go build -trimpath -ldflags='-s -w' -o /out/healthcheck ./cmd/healthcheck && \
    go build -trimpath -ldflags='-s -w' -o /out/nats-server github.com/nats-io/nats-server/v2 && \
    mkdir /jetstream

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/orderservice /out/paymentchannel /out/lab /out/healthcheck /out/nats-server /
# JetStream's store when the image runs the NATS server: a named volume
# mounted on /data starts as a copy of it, writable by nonroot.
COPY --from=build --chown=65532:65532 /jetstream /data
USER nonroot:nonroot
# 8080: order API; 8081: payment channel and 8090: lab (their own
# containers in compose).
EXPOSE 8080 8081 8090
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["/healthcheck", "http://127.0.0.1:8080/readyz"]
ENTRYPOINT ["/orderservice"]
