// Package httpapi is the HTTP face of the service: routes, authentication,
// request decoding, and writing what the use cases return (an
// idempotency.Result or an error, as package answer renders it) to the
// wire.
package httpapi

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/decode"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/metrics"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/problem"
)

// Orders is what the handlers ask of the service: the order use cases
// (order.Service), and nothing the use cases run on.
type Orders interface {
	Create(ctx context.Context, c order.Caller, req order.CreateRequest) (idempotency.Result, error)
	Pay(ctx context.Context, c order.Caller, orderID string, req order.PayRequest) (idempotency.Result, error)
	Cancel(ctx context.Context, c order.Caller, orderID string, req order.CancelRequest) (idempotency.Result, error)
	Ship(ctx context.Context, c order.Caller, orderID string, req order.ShipRequest) (idempotency.Result, error)
	Deliver(ctx context.Context, c order.Caller, orderID string, req order.DeliverRequest) (idempotency.Result, error)
	Get(ctx context.Context, tenantID, orderID string) (*order.Order, error)
	List(ctx context.Context, tenantID string, f order.ListFilter) (order.Page, error)
	History(ctx context.Context, tenantID, orderID string, pg order.PageRequest) (order.HistoryPage, error)
	ReceiveChannelEvent(ctx context.Context, webhookID, eventType, channelKey string) (order.Receipt, error)
	IdempotencyRecords(ctx context.Context, tenantID, key string) ([]idempotency.Record, error)
	IdempotencyPolicy() order.PolicyView
}

// Server holds what the handlers need.
type Server struct {
	Orders Orders
	// Ready reports whether the service can serve /v1 (GET /readyz): the
	// schema version when it can, a problem saying why not when it cannot.
	Ready  func(ctx context.Context) (schemaVersion uint, err error)
	Logger *slog.Logger
	// Tenants maps the SHA-256 of an API key to its tenant.
	Tenants map[[32]byte]string
	Metrics *metrics.Metrics
	// Admission sheds load on /v1 (see HTTPHandler); nil admits everything.
	Admission *Admission
	// Quotas are each tenant's quotas on /v1; nil sets none.
	Quotas *Quotas
	// BodyTimeout bounds how long a request's body may take to arrive
	// after its headers; 0 sets no bound.
	BodyTimeout time.Duration
	// CORSOrigins are the origins whose pages may call /v1; none: CORS off.
	CORSOrigins []string
	// WebhookSecrets verify the payment channel's webhooks: any of them
	// (two while one is rotated).
	WebhookSecrets []string
}

// HTTPHandler is Handler behind the Guard (body deadline, quotas,
// admission limit), with CORS around both and a server span around
// everything (see traced): what the service serves.
func (s *Server) HTTPHandler() http.Handler {
	return traced(WithCORS(s.Guard(s.Handler()), s.CORSOrigins))
}

// NewTenants builds the API-key table from tenant -> key pairs. Keys are
// stored hashed, so a lookup does not compare secrets byte by byte.
func NewTenants(keys map[string]string) map[[32]byte]string {
	t := make(map[[32]byte]string, len(keys))
	for tenant, key := range keys {
		t[sha256.Sum256([]byte(key))] = tenant
	}
	return t
}

// Handler builds the echo instance with every route and middleware.
func (s *Server) Handler() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	e.JSONSerializer = plainJSON{}
	e.Use(s.traceRequests, s.logRequests, s.measure, s.answerErrors)
	// A panic in a handler rolls its transaction back (GORM re-panics after
	// ROLLBACK) and becomes a 500 here instead of a dropped connection.
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{DisableStackAll: true, DisablePrintStack: true}))
	s.routes(e)
	return e
}

// plainJSON is echo's JSON serializer but for HTML escaping: the reads
// (an order, a page of orders, its events) write `<`, `>` and `&` as they
// are, as the stored answers do (order.Wire).
type plainJSON struct{ echo.DefaultJSONSerializer }

func (plainJSON) Serialize(c echo.Context, v any, indent string) error {
	enc := json.NewEncoder(c.Response())
	enc.SetEscapeHTML(false)
	enc.SetIndent("", indent)
	return enc.Encode(v)
}

// handleError is the one place where an error becomes a response. Only
// 5xx are logged as errors: the rest are the client's business.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	resp := answer.RenderError(outsideTheAPI(echoProblem(err), c.Request().URL.Path))
	switch {
	case resp.Status == http.StatusServiceUnavailable: // transient, and the client was told to retry
		s.Logger.WarnContext(c.Request().Context(), "request postponed", "err", err, "method", c.Request().Method, "path", c.Path())
	case resp.Status >= http.StatusInternalServerError:
		s.Logger.ErrorContext(c.Request().Context(), "request failed", "err", err, "code", problem.CodeOf(answer.Problem(err)),
			"method", c.Request().Method, "path", c.Path())
	}
	if c.Request().Method == http.MethodHead {
		if resp.RetryAfter > 0 {
			c.Response().Header().Set("Retry-After", retryAfter(resp.RetryAfter))
		}
		_ = c.NoContent(resp.Status)
		return
	}
	_ = send(c, resp)
}

// echoProblem turns echo's own errors (unknown route, wrong method, body
// too large or not JSON) into the domain errors they answer; any other
// error passes unchanged.
func echoProblem(err error) error {
	var he *echo.HTTPError
	if !errors.As(err, &he) {
		return err
	}
	switch he.Code {
	case http.StatusNotFound:
		return problem.Errorf(problem.NotFound, "No such resource.")
	case http.StatusMethodNotAllowed:
		return problem.Errorf(problem.MethodNotAllowed, "This method is not allowed on this resource.")
	case http.StatusRequestEntityTooLarge:
		return decode.TooLarge()
	case http.StatusUnsupportedMediaType:
		return problem.Errorf(problem.UnsupportedMediaType, "Send the body as application/json.")
	}
	return err
}

// outsideTheAPI tells a request for an unknown path outside /v1 where the
// API is (a newcomer's first guess is often /orders); any other error
// passes unchanged.
func outsideTheAPI(err error, path string) error {
	if problem.CodeOf(err) != problem.NotFound || path == "/v1" || strings.HasPrefix(path, "/v1/") {
		return err
	}
	return problem.Errorf(problem.NotFound, "No such path: the API is under /v1 (for instance GET /v1/orders); "+
		"/healthz, /readyz and /metrics are beside it.")
}

// send writes a rendered answer.
func send(c echo.Context, resp answer.Response) error {
	h := c.Response().Header()
	if resp.Location != "" {
		h.Set("Location", resp.Location)
	}
	if resp.Replayed {
		h.Set("Idempotent-Replayed", "true")
	}
	if resp.RetryAfter > 0 {
		h.Set("Retry-After", retryAfter(resp.RetryAfter))
	}
	return c.Blob(resp.Status, resp.ContentType, resp.Body)
}

// retryAfter renders a wait as Retry-After's delay-seconds: whole seconds,
// rounded up, never less than 1 (a 0 would invite an immediate retry storm).
func retryAfter(d time.Duration) string {
	return strconv.FormatInt(max(1, int64((d+time.Second-1)/time.Second)), 10)
}
