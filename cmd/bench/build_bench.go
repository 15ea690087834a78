//go:build bench

package main

// withoutIdempotencyRoute is true in builds with -tags bench, where the
// service serves POST /v1/bench/orders-without-idempotency (scenario 2).
const withoutIdempotencyRoute = true
