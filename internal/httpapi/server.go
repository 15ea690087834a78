// Package httpapi is the HTTP face of the service: routes, authentication,
// request decoding, and the one place where errors become problem+json.
package httpapi

import (
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/metrics"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/problem"
)

// Server holds what the handlers need.
type Server struct {
	Orders  *order.Service
	Records *idempotency.Store
	DB      *gorm.DB
	Logger  *slog.Logger
	// Tenants maps the SHA-256 of an API key to its tenant.
	Tenants map[[32]byte]string
	// Policy is the retention policy in force, shown read-only.
	Policy  idempotency.Policy
	Metrics *metrics.Metrics
	// Admission sheds load on /v1 (see HTTPHandler); nil admits everything.
	Admission *Admission
}

// HTTPHandler is Handler behind the admission limit: what the service
// serves.
func (s *Server) HTTPHandler() http.Handler { return s.Admission.Wrap(s.Handler()) }

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
	e.Use(s.logRequests)
	// A panic in a handler rolls its transaction back (GORM re-panics after
	// ROLLBACK) and becomes a 500 here instead of a dropped connection.
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{DisableStackAll: true, DisablePrintStack: true}))
	s.routes(e)
	return e
}

// handleError is the one place where an error becomes a response. Only
// 5xx are logged as errors: the rest are the client's business.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	p := toProblem(err)
	status, body := problem.Render(p)
	c.Set(ctxCode, string(p.Code))
	switch {
	case status == http.StatusServiceUnavailable: // transient, and the client was told to retry
		s.Logger.WarnContext(c.Request().Context(), "request postponed", "err", err, "method", c.Request().Method, "path", c.Path())
	case status >= http.StatusInternalServerError:
		s.Logger.ErrorContext(c.Request().Context(), "request failed", "err", err, "code", p.Code,
			"method", c.Request().Method, "path", c.Path())
	}
	if p.RetryAfter > 0 {
		c.Response().Header().Set("Retry-After", retryAfter(p.RetryAfter))
	}
	if c.Request().Method == http.MethodHead {
		_ = c.NoContent(status)
		return
	}
	_ = c.Blob(status, problem.ContentType, body)
}

// toProblem maps every error the handlers can see to a problem.
func toProblem(err error) *problem.Error {
	var he *echo.HTTPError
	switch {
	case errors.As(err, &he):
		switch he.Code {
		case http.StatusNotFound:
			return problem.Errorf(problem.NotFound, "No such resource.")
		case http.StatusMethodNotAllowed:
			return problem.Errorf(problem.MethodNotAllowed, "This method is not allowed on this resource.")
		case http.StatusRequestEntityTooLarge:
			return problem.Errorf(problem.PayloadTooLarge, "The request body is larger than %d bytes.", maxBody)
		case http.StatusUnsupportedMediaType:
			return problem.Errorf(problem.UnsupportedMediaType, "Send the body as application/json.")
		}
	case problem.CodeOf(err) != problem.Internal:
		return problem.As(err)
	case database.IsUnavailable(err) || database.IsLockTimeout(err) || errors.Is(err, context.DeadlineExceeded):
		return &problem.Error{Code: problem.ServiceUnavailable, Detail: "A dependency is unavailable; retry with the same Idempotency-Key.", RetryAfter: time.Second}
	}
	return problem.As(err)
}

// send writes an operation's response: the stored one when replayed.
func send(c echo.Context, resp idempotency.Response) error {
	h := c.Response().Header()
	if resp.Location != "" {
		h.Set("Location", resp.Location)
	}
	if resp.Replayed {
		h.Set("Idempotent-Replayed", "true")
		c.Set(ctxOutcome, outcomeReplayed)
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
