package httpapi_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/orderservice/orderservice/internal/httpapi"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/metrics"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/problem"
)

// fakeOrders is the order service as the door sees it (httpapi.Orders),
// each use case a function the test sets; one left nil answers 500, as a
// use case the test did not expect to be called.
type fakeOrders struct {
	create   func(context.Context, order.Caller, order.CreateRequest) (idempotency.Result, error)
	pay      func(context.Context, order.Caller, string, order.PayRequest) (idempotency.Result, error)
	list     func(context.Context, string, order.ListFilter) (order.Page, error)
	records  func(context.Context, string, string) ([]idempotency.Record, error)
	policy   order.PolicyView
	received func(ctx context.Context, webhookID, eventType, channelKey string) (order.Receipt, error)
}

var errUnexpected = problem.Errorf(problem.Internal, "a use case the test did not expect was called")

func (f *fakeOrders) Create(ctx context.Context, c order.Caller, req order.CreateRequest) (idempotency.Result, error) {
	if f.create == nil {
		return idempotency.Result{}, errUnexpected
	}
	return f.create(ctx, c, req)
}

func (f *fakeOrders) Pay(ctx context.Context, c order.Caller, id string, req order.PayRequest) (idempotency.Result, error) {
	if f.pay == nil {
		return idempotency.Result{}, errUnexpected
	}
	return f.pay(ctx, c, id, req)
}

func (f *fakeOrders) Cancel(context.Context, order.Caller, string, order.CancelRequest) (idempotency.Result, error) {
	return idempotency.Result{}, errUnexpected
}

func (f *fakeOrders) Ship(context.Context, order.Caller, string, order.ShipRequest) (idempotency.Result, error) {
	return idempotency.Result{}, errUnexpected
}

func (f *fakeOrders) Deliver(context.Context, order.Caller, string, order.DeliverRequest) (idempotency.Result, error) {
	return idempotency.Result{}, errUnexpected
}

func (f *fakeOrders) Get(context.Context, string, string) (*order.Order, error) {
	return nil, errUnexpected
}

func (f *fakeOrders) List(ctx context.Context, tenantID string, lf order.ListFilter) (order.Page, error) {
	if f.list == nil {
		return order.Page{}, nil
	}
	return f.list(ctx, tenantID, lf)
}

func (f *fakeOrders) History(context.Context, string, string, order.PageRequest) (order.HistoryPage, error) {
	return order.HistoryPage{}, errUnexpected
}

func (f *fakeOrders) ReceiveChannelEvent(ctx context.Context, webhookID, eventType, channelKey string) (order.Receipt, error) {
	if f.received == nil {
		return "", errUnexpected
	}
	return f.received(ctx, webhookID, eventType, channelKey)
}

func (f *fakeOrders) IdempotencyRecords(ctx context.Context, tenantID, key string) ([]idempotency.Record, error) {
	if f.records == nil {
		return nil, errUnexpected
	}
	return f.records(ctx, tenantID, key)
}

func (f *fakeOrders) IdempotencyPolicy() order.PolicyView { return f.policy }

var _ httpapi.Orders = (*fakeOrders)(nil)

// keyAcme is the API key of the tenant acme on a served fake.
const keyAcme = "key-acme"

// serve serves the door (HTTPHandler) on orders, with edit's changes to
// its Server, for the test's life.
func serve(t *testing.T, orders *fakeOrders, edit func(*httpapi.Server)) *httptest.Server {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	s := &httpapi.Server{Orders: orders, Logger: logger,
		Ready:   func(context.Context) (uint, error) { return 1, nil },
		Tenants: httpapi.NewTenants(map[string]string{"acme": keyAcme}),
		Metrics: metrics.New(func(context.Context) (idempotency.Gauges, error) { return idempotency.Gauges{}, nil },
			logger, order.Operations, order.MoneyOperations)}
	if edit != nil {
		edit(s)
	}
	srv := httptest.NewServer(s.HTTPHandler())
	t.Cleanup(srv.Close)
	return srv
}
