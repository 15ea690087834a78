// Package tracing turns OpenTelemetry traces on from the standard OTEL_*
// variables and carries trace context across the doors HTTP does not cover
// by itself (NATS messages, the outbox). It is machinery beside the core:
// the use cases only start a span and name what the idempotency layer did.
//
// Off by default. OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) turns it on; the OTLP/HTTP exporter
// reads the rest of its OTEL_EXPORTER_OTLP_* settings itself, the SDK reads
// OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG (default: parentbased_always_on),
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES. OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none keeps it off.
//
// Off or on, W3C trace context is propagated: a traceparent that arrives is
// passed on, so a trace started by a client crosses the service even when
// this instance records nothing.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// Name is the instrumentation scope of every span the service starts.
const Name = "github.com/orderservice/orderservice"

// Tracer is the service's tracer, from the global provider (a no-op one
// while tracing is off).
func Tracer() trace.Tracer { return otel.Tracer(Name) }

// Enabled reports whether environ turns tracing on (see the package doc).
func Enabled(environ map[string]string) bool {
	if strings.EqualFold(environ["OTEL_SDK_DISABLED"], "true") || strings.EqualFold(environ["OTEL_TRACES_EXPORTER"], "none") {
		return false
	}
	return environ["OTEL_EXPORTER_OTLP_ENDPOINT"] != "" || environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] != ""
}

// Start installs W3C trace-context propagation and, when environ turns
// tracing on, a tracer provider that batches spans to the OTLP/HTTP
// endpoint. Shutdown flushes what is buffered; call it last.
func Start(ctx context.Context, environ map[string]string, service string) (shutdown func(context.Context) error, err error) {
	propagate()
	if !Enabled(environ) {
		return func(context.Context) error { return nil }, nil
	}
	// The endpoint is taken from environ (the process's environment, or a
	// test's); the exporter reads its other settings from the process's.
	var opts []otlptracehttp.Option
	if u := environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]; u != "" {
		opts = append(opts, otlptracehttp.WithEndpointURL(u))
	} else if u := environ["OTEL_EXPORTER_OTLP_ENDPOINT"]; u != "" {
		opts = append(opts, otlptracehttp.WithEndpointURL(strings.TrimRight(u, "/")+"/v1/traces"))
	}
	exporter, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: the OTLP exporter: %w", err)
	}
	return Install(ctx, service, sdktrace.WithBatcher(exporter)), nil
}

func propagate() {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
}

// Install makes a tracer provider with opts (a batcher to an exporter, or a
// test's span recorder) the global one, for service, with W3C propagation;
// the sampler is the SDK's, read from OTEL_TRACES_SAMPLER.
func Install(ctx context.Context, service string, opts ...sdktrace.TracerProviderOption) (shutdown func(context.Context) error) {
	propagate()
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(service)))
	if err != nil && res == nil { // a partial resource (a bad OTEL_RESOURCE_ATTRIBUTES) is still one
		res = resource.Default()
	}
	// WithFromEnv's OTEL_SERVICE_NAME wins over the default name.
	if res, err = resource.Merge(resource.NewSchemaless(semconv.ServiceName(service)), res); err != nil {
		res = resource.Default()
	}
	tp := sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{sdktrace.WithResource(res)}, opts...)...)
	otel.SetTracerProvider(tp)
	return func(ctx context.Context) error { return errors.Join(tp.ForceFlush(ctx), tp.Shutdown(ctx)) }
}

// Inject writes ctx's trace context into a message's headers.
func Inject(ctx context.Context, header map[string][]string) {
	otel.GetTextMapPropagator().Inject(ctx, headerCarrier(header))
}

// Extract returns ctx with the trace context a message's headers carry.
func Extract(ctx context.Context, header map[string][]string) context.Context {
	return otel.GetTextMapPropagator().Extract(ctx, headerCarrier(header))
}

// Traceparent is ctx's span as a W3C traceparent ("" with no valid span):
// what an outbox row keeps of the transaction that wrote it.
func Traceparent(ctx context.Context) string {
	h := map[string][]string{}
	propagation.TraceContext{}.Inject(ctx, headerCarrier(h))
	if v := h["traceparent"]; len(v) == 1 {
		return v[0]
	}
	return ""
}

// SpanContextOf parses a traceparent written by Traceparent.
func SpanContextOf(traceparent string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), headerCarrier{"traceparent": {traceparent}})
	return trace.SpanContextFromContext(ctx)
}

// headerCarrier reads and writes trace context in NATS message headers.
// nats.Header is a map like http.Header but does not canonicalise its keys,
// and publishers write "traceparent" in any case: reads match any case,
// writes use the W3C spelling (lower case).
type headerCarrier map[string][]string

func (h headerCarrier) Get(key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range h {
		if strings.EqualFold(k, key) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

func (h headerCarrier) Set(key, value string) {
	for k := range h {
		if strings.EqualFold(k, key) {
			delete(h, k)
		}
	}
	h[key] = []string{value}
}

func (h headerCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}
