package httpapi

import (
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/problem"
)

// Keys of values a request carries through echo's context, for the metrics
// and the log line.
const (
	ctxTenant      = "tenant"
	ctxOperation   = "operation"
	ctxKey         = "idempotency_key"
	ctxOrderID     = "order_id"
	ctxDisposition = "disposition"
)

// authenticate resolves the tenant from the bearer API key. The tenant comes
// only from here, never from a header or body field.
func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if n := len(c.Request().Header.Values(echo.HeaderAuthorization)); n > 1 {
			// Two keys would leave it to chance which tenant this is.
			return problem.Errorf(problem.InvalidRequest, "Authorization: the header was sent %d times; send it once.", n).With("field", "Authorization")
		}
		tenantID, known := s.tenantOfKey(c.Request().Header.Get(echo.HeaderAuthorization))
		if !known {
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="orderservice"`)
			return problem.Errorf(problem.Unauthenticated, "Send a valid API key as Authorization: Bearer <key>.")
		}
		c.Set(ctxTenant, tenantID)
		return next(c)
	}
}

func tenant(c echo.Context) string { return c.Get(ctxTenant).(string) }

// answerErrors answers an error the handler returned, there and then (see
// handleError), so that the middleware around it sees the status sent. An
// idempotent request's disposition is named from the error here when the
// handler did not name it from a result.
func (s *Server) answerErrors(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		err := next(c)
		if err == nil {
			return nil
		}
		if _, named := c.Get(ctxDisposition).(idempotency.Disposition); !named {
			c.Set(ctxDisposition, idempotency.DispositionOf(idempotency.Result{}, answer.Problem(echoProblem(err))))
		}
		c.Error(err)
		return nil
	}
}

// measure observes every request's latency and counts each idempotent
// request by what the idempotency layer did with it.
func (s *Server) measure(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		s.Metrics.HTTP(c.Request().Context(), c.Request().Method, c.Path(), c.Response().Status, time.Since(start))
		if op := stringOf(c.Get(ctxOperation)); op != "" {
			s.Metrics.Request(op, disposition(c))
		}
		return err
	}
}

// disposition is what the idempotency layer did with the request; a
// handler that returned neither a result nor an error executed it.
func disposition(c echo.Context) idempotency.Disposition {
	if d, ok := c.Get(ctxDisposition).(idempotency.Disposition); ok {
		return d
	}
	return idempotency.DispositionExecuted
}

// logRequests writes one structured line per request: who, which intent,
// what came of it and how long it took. Never the API key or the body.
func (s *Server) logRequests(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		req, res := c.Request(), c.Response()
		attrs := []slog.Attr{
			slog.String("method", req.Method),
			slog.String("route", c.Path()),
			slog.Int("status", res.Status),
			slog.Float64("latency_ms", float64(time.Since(start).Microseconds())/1000),
		}
		if c.Get(ctxOperation) != nil { // what the idempotency layer did, for idempotent operations
			attrs = append(attrs, slog.String("outcome", string(disposition(c))))
		}
		for _, k := range []string{ctxTenant, ctxOperation, ctxKey, ctxOrderID} {
			if v, ok := c.Get(k).(string); ok && v != "" {
				attrs = append(attrs, slog.String(k, v))
			}
		}
		if id := c.Param("id"); id != "" {
			attrs = append(attrs, slog.String(ctxOrderID, id))
		}
		if t := traceID(c); t != "" {
			attrs = append(attrs, slog.String("trace_id", t))
		}
		if sc := trace.SpanContextFromContext(req.Context()); sc.IsValid() {
			attrs = append(attrs, slog.String("span_id", sc.SpanID().String()))
		}
		s.Logger.LogAttrs(req.Context(), slog.LevelInfo, "request", attrs...)
		return err
	}
}

func stringOf(v any) string {
	s, _ := v.(string)
	return s
}

// traceID is trace-only data: logged, never part of a fingerprint. It is
// the request's trace (the caller's, continued, or one started here), else
// the caller's X-Request-Id.
func traceID(c echo.Context) string {
	if sc := trace.SpanContextFromContext(c.Request().Context()); sc.IsValid() {
		return sc.TraceID().String()
	}
	if tp := c.Request().Header.Get("traceparent"); len(tp) >= 35 {
		return tp[3:35]
	}
	return c.Request().Header.Get(echo.HeaderXRequestID)
}
