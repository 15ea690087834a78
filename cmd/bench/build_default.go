//go:build !bench

package main

// withoutIdempotencyRoute is false in ordinary builds: the service has no
// create without idempotency, and scenario 2 is skipped.
const withoutIdempotencyRoute = false
