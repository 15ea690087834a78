package httpapi

import (
	"crypto/sha256"
	"log/slog"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/orderservice/orderservice/internal/problem"
)

// Keys of values a request carries through echo's context, for the log line.
const (
	ctxTenant    = "tenant"
	ctxOperation = "operation"
	ctxKey       = "idempotency_key"
	ctxOrderID   = "order_id"
	ctxOutcome   = "outcome"
	ctxCode      = "problem_code"
)

const outcomeReplayed = "replayed"

// authenticate resolves the tenant from the bearer API key. The tenant comes
// only from here, never from a header or body field.
func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		auth := c.Request().Header.Get(echo.HeaderAuthorization)
		scheme, key, found := strings.Cut(auth, " ")
		tenantID, known := s.Tenants[sha256.Sum256([]byte(strings.TrimSpace(key)))]
		if !found || !strings.EqualFold(scheme, "Bearer") || !known {
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="orderservice"`)
			return problem.Errorf(problem.Unauthenticated, "Send a valid API key as Authorization: Bearer <key>.")
		}
		c.Set(ctxTenant, tenantID)
		return next(c)
	}
}

func tenant(c echo.Context) string { return c.Get(ctxTenant).(string) }

// logRequests writes one structured line per request: who, which intent,
// what came of it and how long it took. Never the API key or the body.
func (s *Server) logRequests(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		req, res := c.Request(), c.Response()
		took, result := time.Since(start), outcome(c, res.Status)
		s.Metrics.HTTP(req.Method, c.Path(), res.Status, took)
		s.Metrics.Request(stringOf(c.Get(ctxOperation)), result)
		attrs := []slog.Attr{
			slog.String("method", req.Method),
			slog.String("route", c.Path()),
			slog.Int("status", res.Status),
			slog.Float64("latency_ms", float64(took.Microseconds())/1000),
		}
		if c.Get(ctxOperation) != nil { // what the idempotency layer did, for idempotent operations
			attrs = append(attrs, slog.String("outcome", result))
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
		s.Logger.LogAttrs(req.Context(), slog.LevelInfo, "request", attrs...)
		return nil
	}
}

// outcome names what the idempotency layer did with the request.
func outcome(c echo.Context, status int) string {
	if o, ok := c.Get(ctxOutcome).(string); ok {
		return o
	}
	switch problem.Code(stringOf(c.Get(ctxCode))) {
	case "":
		if status < 400 {
			return "executed"
		}
		return "failed"
	case problem.KeyReused:
		return "key_reused"
	case problem.RequestInProgress:
		return "in_progress"
	case problem.InvalidRequest, problem.KeyMissing, problem.KeyInvalid, problem.PayloadTooLarge, problem.UnsupportedMediaType:
		return "validation_rejected"
	case problem.Unauthenticated:
		return "unauthenticated"
	case problem.ServiceUnavailable:
		return "unavailable"
	}
	return "failed"
}

func stringOf(v any) string {
	s, _ := v.(string)
	return s
}

// traceID is trace-only data: logged, never part of a fingerprint.
func traceID(c echo.Context) string {
	h := c.Request().Header
	if tp := h.Get("traceparent"); len(tp) >= 35 {
		return tp[3:35]
	}
	return h.Get(echo.HeaderXRequestID)
}
