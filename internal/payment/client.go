package payment

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Errors of the client, matched with errors.Is.
var (
	// ErrUnavailable means the outcome is unknown (5xx, 429, timeout, lost
	// connection): retry with the same key, or look the key up.
	ErrUnavailable = errors.New("payment channel unavailable, outcome unknown")
	// ErrRejected means the channel refused a charge or refund without
	// acting on it (400, 404 charge unknown, 422 idempotency key reused, 422
	// refund refused, …): a definitive outcome, as final as a decline. Only
	// a POST is refused so; a lookup is found, ErrNotFound, or unknown.
	ErrRejected = errors.New("payment channel rejected the request")
	// ErrNotFound means a lookup found nothing under the key: the channel
	// never acted on it.
	ErrNotFound = errors.New("payment channel has no such charge or refund")
)

// The codes with which the channel says that it holds nothing under a key:
// only a 404 that carries one is ErrNotFound.
const (
	CodeChargeNotFound = "charge_not_found"
	CodeRefundNotFound = "refund_not_found"
)

// maxResponseBody bounds what the client reads from one response.
const maxResponseBody = 1 << 20

// StatusError is a non-success HTTP answer of the channel. It unwraps to
// ErrUnavailable, ErrRejected or ErrNotFound according to its status.
type StatusError struct {
	// StatusCode is the HTTP status the channel answered.
	StatusCode int
	// Code is the problem's stable code, e.g. "idempotency_key_reused".
	Code string
	// Detail is the problem's detail, or the start of a non-problem body.
	Detail string
	// RetryAfter is the channel's Retry-After hint, zero when absent.
	RetryAfter time.Duration
	// Lookup is true for the answer to a GET by idempotency key, where 404
	// means "nothing under this key" rather than a refusal.
	Lookup bool
}

// Error describes the answer in one line.
func (e *StatusError) Error() string {
	msg := fmt.Sprintf("payment channel answered %d", e.StatusCode)
	if e.Code != "" {
		msg += " " + e.Code
	}
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// Unwrap classifies the answer, once, for every caller: errors.Is tells a
// refusal (definitive: the channel did not and will not act on this key)
// from an unknown outcome (retry with the same key, or look it up).
func (e *StatusError) Unwrap() error {
	switch {
	case e.Lookup && e.StatusCode == http.StatusNotFound && (e.Code == CodeChargeNotFound || e.Code == CodeRefundNotFound):
		return ErrNotFound
	case e.Lookup:
		// Any other failed lookup (400, 403, 410, 422, a 404 from a gateway
		// or a wrong path) says nothing of the charge under the key: it is
		// no refusal of it, and no proof that there is none.
		return ErrUnavailable
	case e.StatusCode == http.StatusRequestTimeout,
		e.StatusCode == http.StatusConflict, // request_in_progress: the first attempt is still running
		e.StatusCode == http.StatusTooEarly,
		e.StatusCode == http.StatusTooManyRequests,
		e.StatusCode >= 500:
		return ErrUnavailable
	case e.StatusCode >= 400:
		return ErrRejected
	default: // an unexpected 1xx/2xx/3xx tells us nothing definitive
		return ErrUnavailable
	}
}

// Client calls a payment channel over HTTP. It never retries: the caller owns
// the retry policy and must resend the same idempotency key.
type Client struct {
	baseURL    string
	httpClient *http.Client
}

// NewClient returns a client for the channel at baseURL (e.g.
// "http://127.0.0.1:8081"). A nil httpClient gets one with a 30s timeout.
// Each exchange is traced (see TracedTransport).
func NewClient(baseURL string, httpClient *http.Client) *Client {
	traced := http.Client{Timeout: 30 * time.Second}
	if httpClient != nil {
		traced = *httpClient
	}
	traced.Transport = TracedTransport(traced.Transport)
	return &Client{baseURL: strings.TrimRight(baseURL, "/"), httpClient: &traced}
}

// Charge asks the channel to charge req under the idempotency key. A declined
// charge is a definitive outcome: it is returned with Status "declined" and a
// nil error; so is a charge the channel took on to settle later (202, Status
// "pending"). ErrUnavailable means the charge may or may not have been made.
func (c *Client) Charge(ctx context.Context, key string, req ChargeRequest) (Result[Charge], error) {
	httpReq, err := c.newPost(ctx, "/v1/charges", key, req)
	if err != nil {
		return Result[Charge]{}, err
	}
	return send[Charge](c, httpReq, http.StatusOK, http.StatusCreated, http.StatusAccepted, http.StatusPaymentRequired)
}

// LookupCharge returns the charge the channel made under the idempotency key,
// or ErrNotFound when no charge was made: how recovery learns the real outcome.
func (c *Client) LookupCharge(ctx context.Context, key string) (Charge, error) {
	httpReq, err := c.newLookup(ctx, "/v1/charges", key)
	if err != nil {
		return Charge{}, err
	}
	res, err := send[Charge](c, httpReq, http.StatusOK)
	return res.Value, err
}

// Refund asks the channel to refund req under the idempotency key.
// ErrRejected covers a refund the channel refuses: of an unknown or declined
// charge, of more than remains refundable, or one it will not make.
func (c *Client) Refund(ctx context.Context, key string, req RefundRequest) (Result[Refund], error) {
	httpReq, err := c.newPost(ctx, "/v1/refunds", key, req)
	if err != nil {
		return Result[Refund]{}, err
	}
	return send[Refund](c, httpReq, http.StatusOK, http.StatusCreated)
}

// LookupRefund returns the refund the channel made under the idempotency key,
// or ErrNotFound when none was made.
func (c *Client) LookupRefund(ctx context.Context, key string) (Refund, error) {
	httpReq, err := c.newLookup(ctx, "/v1/refunds", key)
	if err != nil {
		return Refund{}, err
	}
	res, err := send[Refund](c, httpReq, http.StatusOK)
	return res.Value, err
}

func (c *Client) newPost(ctx context.Context, path, key string, body any) (*http.Request, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encoding %s body: %w", path, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+path, bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("building %s request: %w", path, err)
	}
	// Without GetBody, net/http cannot silently resend a POST carrying an
	// Idempotency-Key on a dead keep-alive connection: retries stay the caller's.
	req.GetBody = nil
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return req, nil
}

func (c *Client) newLookup(ctx context.Context, path, key string) (*http.Request, error) {
	u := c.baseURL + path + "?" + url.Values{"idempotency_key": {key}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("building %s lookup: %w", path, err)
	}
	req.Header.Set("Accept", "application/json")
	return req, nil
}

// send performs one exchange; a status in definitive has a T as its body.
func send[T any](c *Client, req *http.Request, definitive ...int) (Result[T], error) {
	resp, err := c.httpClient.Do(req)
	if err != nil {
		return Result[T]{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody))
	if err != nil {
		// A response cut short may follow an action taken: outcome unknown.
		return Result[T]{}, fmt.Errorf("%w: reading %d response: %w", ErrUnavailable, resp.StatusCode, err)
	}
	if !slices.Contains(definitive, resp.StatusCode) {
		e := newStatusError(resp, body)
		e.Lookup = req.Method == http.MethodGet
		return Result[T]{}, e
	}
	var v T
	if err := json.Unmarshal(body, &v); err != nil {
		return Result[T]{}, fmt.Errorf("%w: decoding %d response: %w", ErrUnavailable, resp.StatusCode, err)
	}
	replayed := strings.EqualFold(resp.Header.Get("Idempotent-Replayed"), "true")
	return Result[T]{Value: v, Replayed: replayed}, nil
}

func newStatusError(resp *http.Response, body []byte) *StatusError {
	e := &StatusError{StatusCode: resp.StatusCode}
	var problem struct {
		Code   string `json:"code"`
		Title  string `json:"title"`
		Detail string `json:"detail"`
	}
	if json.Unmarshal(body, &problem) == nil && (problem.Code != "" || problem.Detail != "") {
		e.Code, e.Detail = problem.Code, problem.Detail
		if e.Detail == "" {
			e.Detail = problem.Title
		}
	} else {
		e.Detail = strings.TrimSpace(string(body[:min(len(body), 200)]))
	}
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
		e.RetryAfter = time.Duration(secs) * time.Second
	}
	return e
}
