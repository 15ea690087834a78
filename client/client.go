package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// maxResponseBody bounds what the client reads from one answer; a full page
// of 100 orders of 100 items each fits many times over.
const maxResponseBody = 32 << 20

// Client calls the order service as one tenant. It is safe for concurrent use.
type Client struct {
	baseURL        string
	apiKey         string
	httpClient     *http.Client
	retry          RetryPolicy
	attemptTimeout time.Duration
	wait           time.Duration // Prefer: wait on unsafe calls; 0 sends none

	// sleep and jitter are the backoff's clock and dice, replaced in tests.
	sleep  func(ctx context.Context, d time.Duration) error
	jitter func(ceiling time.Duration) time.Duration
}

// Option configures a Client.
type Option func(*Client)

// WithRetry sets the retry policy; its zero fields keep the defaults.
func WithRetry(p RetryPolicy) Option { return func(c *Client) { c.retry = p.withDefaults() } }

// WithAttemptTimeout bounds each attempt (request and whole answer). An
// attempt that times out is retried under the same key while the call's
// context allows; zero, the default, leaves attempts bounded by the context.
func WithAttemptTimeout(d time.Duration) Option { return func(c *Client) { c.attemptTimeout = d } }

// DefaultWait is how long, by default, an unsafe call asks the server to
// wait for a first attempt still in flight (Prefer: wait=10) before it
// answers 409 request_in_progress.
const DefaultWait = 10 * time.Second

// WithWait sets how long the server may hold an unsafe call whose first
// attempt is still in flight, so the call receives that attempt's outcome
// as soon as it is stored instead of a 409 and a retry later. It is sent as
// `Prefer: wait=N` in whole seconds; the server caps it (MAX_WAIT). Zero
// sends no preference. When the wait runs out, the 409's Retry-After is
// still honoured. An attempt timeout shorter than the wait cuts it short.
func WithWait(d time.Duration) Option { return func(c *Client) { c.wait = max(d, 0) } }

// WithHTTPClient sets the HTTP client the attempts go through. Its Timeout,
// if any, bounds each attempt.
func WithHTTPClient(h *http.Client) Option {
	return func(c *Client) {
		if h != nil {
			c.httpClient = h
		}
	}
}

// New returns a client of the service at baseURL (e.g.
// "http://localhost:8080") for the tenant that apiKey belongs to.
func New(baseURL, apiKey string, opts ...Option) *Client {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 64
	c := &Client{
		baseURL:    strings.TrimRight(baseURL, "/"),
		apiKey:     apiKey,
		httpClient: &http.Client{Transport: transport},
		retry:      RetryPolicy{}.withDefaults(),
		wait:       DefaultWait,
		sleep:      sleepCtx,
		jitter:     fullJitter,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// NewKey returns a fresh idempotency key, a UUIDv7. Make it once per intent,
// store it with the intent if the intent may outlive the process, and pass
// it with WithKey to every call made for that intent.
func NewKey() string { return uuid.Must(uuid.NewV7()).String() }

// Result is a successful answer and how it was reached.
type Result[T any] struct {
	// Value is the decoded answer.
	Value T
	// Replayed is true when the service answered from its idempotency
	// record (Idempotent-Replayed: true): an earlier attempt, or an earlier
	// call with the same key, had already done the work.
	Replayed bool
	// Attempts counts the requests this client sent for the call.
	Attempts int
	// Key is the idempotency key every attempt carried; empty for reads.
	Key string
	// Status is the HTTP status of the last answer, zero if none arrived.
	Status int
}

// CallOption configures one call.
type CallOption func(*callConfig)

type callConfig struct{ key string }

// encode is a call's body as JSON; nil when it has none.
func encode(body any) ([]byte, error) {
	if body == nil {
		return nil, nil
	}
	return json.Marshal(body)
}

// keyFor is the Idempotency-Key of a call: the one WithKey names, else a
// new one; none for a read.
func keyFor(method string, opts []CallOption) string {
	if method == http.MethodGet {
		return ""
	}
	var cfg callConfig
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.key == "" {
		return NewKey()
	}
	return cfg.key
}

// WithKey makes the call use key as its Idempotency-Key instead of a new
// one. Pass the same key again to resume an intent whose earlier call
// failed or whose outcome is unknown; never pass it for another intent.
func WithKey(key string) CallOption { return func(c *callConfig) { c.key = key } }

// call is every API method: it sends method path until a final answer, a
// success, the context's end or the last attempt, all under one key.
func call[T any](ctx context.Context, c *Client, method, path string, body any, opts []CallOption) (Result[T], error) {
	var res Result[T]
	payload, err := encode(body)
	if err != nil {
		return res, fmt.Errorf("%s %s: encoding the body: %w", method, path, err)
	}
	// The key names the intent, so it is made here, once, before the
	// first attempt: every retry below resends it unchanged.
	res.Key = keyFor(method, opts)

	var lastErr error
	for {
		if err := ctx.Err(); err != nil {
			return res, giveUp(method, path, res.Attempts, err, lastErr)
		}
		res.Attempts++
		ans, err := c.attempt(ctx, method, path, payload, res.Key)
		var retryAfter time.Duration
		switch {
		case err != nil && ctx.Err() != nil:
			// The context cut this attempt short: the last answer, if any,
			// says more about the call than "context deadline exceeded".
			if lastErr == nil {
				lastErr = fmt.Errorf("%s %s: attempt %d: %w", method, path, res.Attempts, err)
			}
			return res, giveUp(method, path, res.Attempts, ctx.Err(), lastErr)
		case err != nil:
			var final *finalError
			if errors.As(err, &final) {
				return res, fmt.Errorf("%s %s: %w", method, path, final.err)
			}
			// The request may or may not have reached the service: only
			// the same key makes sending it again safe.
			lastErr = fmt.Errorf("%s %s: attempt %d: %w", method, path, res.Attempts, err)
		default:
			res.Status = ans.status
			if ans.status >= 200 && ans.status < 300 {
				res.Replayed = strings.EqualFold(ans.header.Get("Idempotent-Replayed"), "true")
				if err := json.Unmarshal(ans.body, &res.Value); err != nil {
					return res, fmt.Errorf("%s %s: decoding the %d answer: %w", method, path, ans.status, err)
				}
				return res, nil
			}
			pe := ans.problem
			pe.Attempts, pe.Key = res.Attempts, res.Key
			if !retryableStatus(pe.Status, pe.Code) {
				return res, fmt.Errorf("%s %s: %w", method, path, pe)
			}
			lastErr = fmt.Errorf("%s %s: %w", method, path, pe)
			retryAfter = pe.RetryAfter
		}

		if res.Attempts >= c.retry.MaxAttempts {
			return res, lastErr
		}
		wait := c.retry.backoff(res.Attempts, retryAfter, c.jitter)
		// A wait that ends after the deadline cannot help: the server asked
		// not to be called sooner, so give up now rather than sleep in vain.
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return res, giveUp(method, path, res.Attempts, context.DeadlineExceeded, lastErr)
		}
		if err := c.sleep(ctx, wait); err != nil {
			return res, giveUp(method, path, res.Attempts, err, lastErr)
		}
	}
}

// giveUp is the error of a call that the context ended: it wraps both the
// context's error and the last answer (or transport failure) before it.
func giveUp(method, path string, attempts int, ctxErr, lastErr error) error {
	if lastErr == nil {
		return fmt.Errorf("%s %s: %w", method, path, ctxErr)
	}
	return fmt.Errorf("gave up after %d attempts: %w: %w", attempts, ctxErr, lastErr)
}

// answer is one HTTP answer read whole.
type answer struct {
	status  int
	header  http.Header
	body    []byte
	problem *ProblemError // set for non-2xx answers
}

// finalError marks a failure that another attempt cannot cure.
type finalError struct{ err error }

func (e *finalError) Error() string { return e.err.Error() }

// attempt sends one request and reads its whole answer. An error is a
// transport failure (retryable) unless it is a *finalError.
func (c *Client) attempt(ctx context.Context, method, path string, payload []byte, key string) (answer, error) {
	if c.attemptTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.attemptTimeout)
		defer cancel()
	}
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.baseURL+path, body)
	if err != nil {
		return answer{}, &finalError{fmt.Errorf("building the request: %w", err)}
	}
	// Without GetBody, net/http cannot silently resend this POST on a dead
	// keep-alive connection (it would, since it carries an Idempotency-Key):
	// every resend goes through the loop above, which counts it.
	req.GetBody = nil
	req.Header.Set("Accept", "application/json, application/problem+json")
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
		if secs := int(c.wait / time.Second); secs > 0 {
			req.Header.Set("Prefer", "wait="+strconv.Itoa(secs))
		}
	}
	resp, err := c.httpClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody+1))
	if err != nil {
		// An answer cut short may follow work done: outcome unknown.
		return answer{}, fmt.Errorf("reading the %d answer: %w", resp.StatusCode, err)
	}
	if len(b) > maxResponseBody {
		return answer{}, &finalError{fmt.Errorf("the %d answer exceeds %d bytes", resp.StatusCode, maxResponseBody)}
	}
	ans := answer{status: resp.StatusCode, header: resp.Header, body: b}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		ans.problem = newProblemError(resp, b)
	}
	return ans, nil
}
