package httpapi

import (
	"net/http"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderservice/orderservice/internal/order"
)

// traced gives every request to the service a server span (otelhttp's,
// PostgreSQL's and the channel's spans are its children), continuing the
// caller's trace when it sends a traceparent. A request the admission
// limit sheds has its span too. Probes and scrapes are not traced.
func traced(h http.Handler) http.Handler {
	return otelhttp.NewHandler(h, "orderservice",
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }),
		otelhttp.WithFilter(func(r *http.Request) bool {
			switch r.URL.Path {
			case "/healthz", "/readyz", "/metrics":
				return false
			}
			return true
		}))
}

// traceRequests names the server span by its route once echo has routed
// the request, and adds what the idempotency layer did with it (the use
// case's own span says more).
func (s *Server) traceRequests(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		span := trace.SpanFromContext(c.Request().Context())
		if !span.IsRecording() {
			return next(c)
		}
		route := c.Path()
		span.SetName(c.Request().Method + " " + route)
		span.SetAttributes(semconv.HTTPRoute(route))
		err := next(c)
		if op := stringOf(c.Get(ctxOperation)); op != "" {
			span.SetAttributes(attribute.String("orderservice.operation", op),
				attribute.String("idempotency.disposition", string(disposition(c))))
		}
		return err
	}
}

// traceWebhook adds what came of a verified delivery to its server span
// (the channel's delivery span is its parent when the channel traces).
func traceWebhook(c echo.Context, id string, ev channelEvent, receipt order.Receipt) {
	trace.SpanFromContext(c.Request().Context()).SetAttributes(
		attribute.String("webhook.id", id),
		attribute.String("webhook.event_type", ev.Type),
		attribute.String("payment.idempotency_key", ev.Data.IdempotencyKey),
		attribute.String("webhook.outcome", string(receipt)))
}
