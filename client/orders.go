package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
)

// CreateOrder creates an order (POST /v1/orders, 201). Creation needs the
// key most: until the answer arrives the caller has no order id, so only
// the key lets a retry find the order a lost answer created.
func (c *Client) CreateOrder(ctx context.Context, req CreateOrderRequest, opts ...CallOption) (Result[Order], error) {
	return call[Order](ctx, c, http.MethodPost, "/v1/orders", req, opts)
}

// Pay charges the order's total through the payment channel
// (POST /v1/orders/{id}/pay). The service passes a key derived from this
// call's key to the channel, so retries never charge twice. A declined
// charge is a *ProblemError for which IsDeclined is true.
func (c *Client) Pay(ctx context.Context, orderID string, req PayRequest, opts ...CallOption) (Result[Order], error) {
	return call[Order](ctx, c, http.MethodPost, orderPath(orderID, "/pay"), req, opts)
}

// Cancel cancels the order, refunding it first if it was paid
// (POST /v1/orders/{id}/cancel).
func (c *Client) Cancel(ctx context.Context, orderID string, req CancelRequest, opts ...CallOption) (Result[Order], error) {
	return call[Order](ctx, c, http.MethodPost, orderPath(orderID, "/cancel"), req, opts)
}

// Ship marks a paid order shipped (POST /v1/orders/{id}/ship).
func (c *Client) Ship(ctx context.Context, orderID string, req ShipRequest, opts ...CallOption) (Result[Order], error) {
	return call[Order](ctx, c, http.MethodPost, orderPath(orderID, "/ship"), req, opts)
}

// Deliver marks a shipped order delivered (POST /v1/orders/{id}/deliver).
func (c *Client) Deliver(ctx context.Context, orderID string, opts ...CallOption) (Result[Order], error) {
	return call[Order](ctx, c, http.MethodPost, orderPath(orderID, "/deliver"), struct{}{}, opts)
}

// GetOrder reads one order with its payment summary (GET /v1/orders/{id}).
func (c *Client) GetOrder(ctx context.Context, orderID string) (Result[Order], error) {
	return call[Order](ctx, c, http.MethodGet, orderPath(orderID, ""), nil, nil)
}

// ListOrders reads one page of the tenant's orders, newest first
// (GET /v1/orders).
func (c *Client) ListOrders(ctx context.Context, opts ListOptions) (Result[OrderPage], error) {
	q := url.Values{}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.Cursor != "" {
		q.Set("cursor", opts.Cursor)
	}
	if opts.Status != "" {
		q.Set("status", string(opts.Status))
	}
	if opts.CustomerID != "" {
		q.Set("customer_id", opts.CustomerID)
	}
	path := "/v1/orders"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return call[OrderPage](ctx, c, http.MethodGet, path, nil, nil)
}

// Events reads the order's history, oldest first, each entry with the
// idempotency key of the intent that made it (GET /v1/orders/{id}/events).
func (c *Client) Events(ctx context.Context, orderID string) (Result[[]OrderEvent], error) {
	res, err := call[struct {
		Events []OrderEvent `json:"events"`
	}](ctx, c, http.MethodGet, orderPath(orderID, "/events"), nil, nil)
	return unwrap(res, res.Value.Events), err
}

// IdempotencyRecords reads what the service remembers about key for this
// tenant, one record per operation it was used for
// (GET /v1/idempotency-records?key=K).
func (c *Client) IdempotencyRecords(ctx context.Context, key string) (Result[[]IdempotencyRecord], error) {
	res, err := call[struct {
		Records []IdempotencyRecord `json:"records"`
	}](ctx, c, http.MethodGet, "/v1/idempotency-records?"+url.Values{"key": {key}}.Encode(), nil, nil)
	return unwrap(res, res.Value.Records), err
}

func orderPath(orderID, suffix string) string {
	return "/v1/orders/" + url.PathEscape(orderID) + suffix
}

// unwrap moves a result's metadata onto the value taken out of its envelope.
func unwrap[E, T any](res Result[E], v T) Result[T] {
	return Result[T]{Value: v, Replayed: res.Replayed, Attempts: res.Attempts, Key: res.Key, Status: res.Status}
}
