package httpapi

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/problem"
)

// errReachedDatabase is what a use case returns once its request passed
// validation: the fuzz target runs without a database, so "accepted" shows
// up as the first transaction being refused.
var errReachedDatabase = errors.New("the request passed validation and reached the database")

// noDatabase is a connection pool that refuses every transaction.
type noDatabase struct{}

func (noDatabase) PrepareContext(context.Context, string) (*sql.Stmt, error) {
	return nil, errReachedDatabase
}
func (noDatabase) ExecContext(context.Context, string, ...any) (sql.Result, error) {
	return nil, errReachedDatabase
}
func (noDatabase) QueryContext(context.Context, string, ...any) (*sql.Rows, error) {
	return nil, errReachedDatabase
}
func (noDatabase) QueryRowContext(context.Context, string, ...any) *sql.Row {
	panic(errReachedDatabase)
}
func (noDatabase) BeginTx(context.Context, *sql.TxOptions) (gorm.ConnPool, error) {
	return nil, errReachedDatabase
}

// fuzzedRoute decodes a body the way one idempotent route does, then hands
// it to that route's use case.
type fuzzedRoute struct {
	name string
	run  func(c echo.Context, s *order.Service) (decodeErr, useErr error)
}

// through decodes into Req with the handlers' decoder and, if that worked,
// runs the use case on it, as idempotentOn does.
func through[Req any](use func(*order.Service) func(context.Context, order.Caller, string, Req) (idempotency.Result, error)) func(echo.Context, *order.Service) (error, error) {
	return func(c echo.Context, s *order.Service) (error, error) {
		var req Req
		if err := readBody(c, &req); err != nil {
			return err, nil
		}
		_, err := use(s)(c.Request().Context(), order.Caller{TenantID: "fuzz", Key: "K1"}, "0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3", req)
		return nil, err
	}
}

var fuzzedRoutes = []fuzzedRoute{
	{"create", through(func(s *order.Service) func(context.Context, order.Caller, string, order.CreateRequest) (idempotency.Result, error) {
		return func(ctx context.Context, c order.Caller, _ string, r order.CreateRequest) (idempotency.Result, error) {
			return s.Create(ctx, c, r)
		}
	})},
	{"pay", through(func(s *order.Service) func(context.Context, order.Caller, string, order.PayRequest) (idempotency.Result, error) {
		return s.Pay
	})},
	{"ship", through(func(s *order.Service) func(context.Context, order.Caller, string, order.ShipRequest) (idempotency.Result, error) {
		return s.Ship
	})},
	{"cancel", through(func(s *order.Service) func(context.Context, order.Caller, string, order.CancelRequest) (idempotency.Result, error) {
		return s.Cancel
	})},
	{"deliver", through(func(s *order.Service) func(context.Context, order.Caller, string, order.DeliverRequest) (idempotency.Result, error) {
		return s.Deliver
	})},
}

// FuzzDecodeRequest sends any body with any content type through the strict
// decoder and the use case's validation: nothing panics, and every refusal
// is a problem a client can act on (400 invalid_request, 413 or 415), never
// a 500.
func FuzzDecodeRequest(f *testing.F) {
	for i, body := range []string{
		`{"customer_id":"cus_1","currency":"eur","items":[{"sku":"SKU-1","quantity":2,"unit_price":1250}]}`,
		`{"payment_method":"pm_ok"}`,
		`{"carrier":"DHL","tracking_number":"T-1"}`,
		`{"reason":"changed my mind"}`,
		``,
		`{"tenant_id":"globex"}`,
		`{"customer_id":"c"} {"customer_id":"d"}`,
		`{"items":[{"sku":"S","quantity":1,"unit_price":1e30}]}`,
		`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[`,
		`{"customer_id":"a","customer_id":"b"}`,
	} {
		f.Add(uint8(i), "application/json", []byte(body))
	}
	f.Add(uint8(0), "text/plain", []byte(`{}`))
	f.Add(uint8(1), "application/problem+json; charset=utf-8", []byte(`{"payment_method":" pm_ok "}`))
	f.Add(uint8(2), "application/json;;", []byte(`{}`))

	db, err := gorm.Open(postgres.New(postgres.Config{Conn: noDatabase{}}),
		&gorm.Config{DisableAutomaticPing: true, Logger: logger.Discard})
	if err != nil {
		f.Fatal(err)
	}
	svc := order.NewService(order.Deps{DB: db})
	e := echo.New()
	f.Fuzz(func(t *testing.T, route uint8, contentType string, body []byte) {
		r := fuzzedRoutes[int(route)%len(fuzzedRoutes)]
		req := httptest.NewRequest(http.MethodPost, "/v1/orders", bytes.NewReader(body))
		req.Header.Set(echo.HeaderContentType, contentType)
		decodeErr, useErr := r.run(e.NewContext(req, httptest.NewRecorder()), svc)

		if decodeErr != nil {
			var he *echo.HTTPError
			var pe *problem.Error
			switch {
			case errors.As(decodeErr, &he) && (he.Code == http.StatusRequestEntityTooLarge || he.Code == http.StatusUnsupportedMediaType):
			case errors.As(decodeErr, &pe) && pe.Code == problem.InvalidRequest && pe.Extensions["field"] != nil:
			default:
				t.Fatalf("%s: decode error %T %v is not a 400 naming a field, a 413 or a 415", r.name, decodeErr, decodeErr)
			}
			wantClientProblem(t, r.name, decodeErr)
			return
		}
		if useErr == nil || errors.Is(useErr, errReachedDatabase) {
			return // accepted
		}
		var pe *problem.Error
		if !errors.As(useErr, &pe) || pe.Code != problem.InvalidRequest || pe.Extensions["field"] == nil {
			t.Fatalf("%s: use case error %T %v is not a 400 invalid_request naming a field", r.name, useErr, useErr)
		}
		wantClientProblem(t, r.name, useErr)
	})
}

// wantClientProblem checks the response the error handler would send.
func wantClientProblem(t *testing.T, route string, err error) {
	t.Helper()
	p := answer.Problem(echoProblem(err))
	switch p.Code {
	case problem.InvalidRequest, problem.PayloadTooLarge, problem.UnsupportedMediaType:
	default:
		t.Fatalf("%s: %v answers %s", route, err, p.Code)
	}
	if r := answer.RenderError(p); r.Status >= 500 || !bytes.Contains(r.Body, []byte(`"code":"`+string(p.Code)+`"`)) {
		t.Fatalf("%s: %v renders as %d %s", route, err, r.Status, r.Body)
	}
}
