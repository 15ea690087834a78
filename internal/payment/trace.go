package payment

import (
	"context"
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// What a trace shows of a call to the channel: a client span per exchange
// (otelhttp's, which also sends the trace context so the channel's server
// span joins the trace), carrying the stable key the request was sent
// under and, when the same key is sent again by a later attempt at the
// intent, how many times it was sent before (http.request.resend_count).

type resendKey struct{}

// Resending tells the client that this call sends its keys for the
// (n+1)th time: n earlier attempts at the intent sent them already.
func Resending(ctx context.Context, n int) context.Context {
	if n <= 0 {
		return ctx
	}
	return context.WithValue(ctx, resendKey{}, n)
}

// TracedTransport is base (http.DefaultTransport when nil) with a client
// span per exchange.
func TracedTransport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return otelhttp.NewTransport(annotated{base},
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return "payment_channel " + r.Method + " " + r.URL.Path }))
}

// annotated runs inside otelhttp's client span and adds what only this
// client knows to it.
type annotated struct{ next http.RoundTripper }

func (a annotated) RoundTrip(r *http.Request) (*http.Response, error) {
	span := trace.SpanFromContext(r.Context())
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		key = r.URL.Query().Get("idempotency_key") // a lookup names the key in its query
	}
	if key != "" {
		span.SetAttributes(attribute.String("payment.idempotency_key", key))
	}
	if n, ok := r.Context().Value(resendKey{}).(int); ok && r.Method == http.MethodPost {
		span.SetAttributes(semconv.HTTPRequestResendCount(n))
	}
	return a.next.RoundTrip(r)
}
