// Package client is a Go client of the order service that retries the right
// way: one idempotency key per intent, made before the first attempt and sent
// unchanged on every retry of that intent.
//
// # Why the key is made before the first attempt
//
// An idempotency key names an intent ("create this order", "pay this order
// once"), not an HTTP request. When an attempt fails in transit, the client
// cannot know whether the service acted: the request may have created order
// O9 or charged the card, and only the answer was lost. A retry under the
// same key R1 lets the service recognise the intent and replay the first
// result (O9, the same charge). A retry under a new key is, for the service
// and for the payment channel behind it, a new intent: it creates O10 or
// charges the card a second time. So each unsafe call makes its key once,
// before anything is sent, and keeps it for every attempt; a caller that
// retries at a higher level (a job queue, a user pressing the button again)
// passes its own stable key with [WithKey] and keeps it just as carefully.
//
// # What is retried
//
// Transport errors (a connection closed before the answer, an attempt that
// timed out, see [WithAttemptTimeout]), 408 (the body did not arrive in
// time), 409 request_in_progress (the first attempt is still running), 429
// (the tenant is over its quota), 502, 503 (a transient failure, or the
// service over its capacity) and 504 are retried with capped exponential
// backoff and full jitter, never sooner than the server's Retry-After (or,
// without one, than the RateLimit field's t of a policy with nothing left,
// draft-ietf-httpapi-ratelimit-headers), within the context deadline and
// [RetryPolicy.MaxAttempts]. A refusal of 408, 429 or 503 happens before
// the service records anything, and the retry carries the same key all the
// same: the client never spends a new key on a retry.
// Final answers are returned at once: 400, 401, 402 payment_declined,
// 404, 409 invalid_transition, 413, 415 and 422 idempotency_key_reused
// (and anything else not listed above). They come back as a *[ProblemError].
//
// A wait that would end after the context's deadline is not started: the
// call returns at once with an error that wraps both
// context.DeadlineExceeded and the last answer. Only this loop resends: the
// client stops net/http from silently resending a POST on a dead keep-alive
// connection, so that every request sent is an attempt counted.
//
// Every answer says how it was reached: [Result.Replayed] is true when the
// service answered from its idempotency record (Idempotent-Replayed: true),
// [Result.Attempts] counts the requests this client sent, and [Result.Key]
// is the key they carried, also when the call failed, so that the intent
// can be resumed later under the same key.
package client
