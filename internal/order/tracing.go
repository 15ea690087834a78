package order

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/problem"
	"github.com/orderservice/orderservice/internal/tracing"
)

// What a trace shows of a use case: one span per attempt at an intent,
// named for its operation, whose attributes say what the idempotency layer
// did with it (idempotency.disposition: executed, replayed, key_reused,
// in_progress, …) and the state its record was left in, and whose events
// mark the record's claim, replay and takeover as they happen. The key is
// an attribute of the span only: it never becomes a metric label.
//
// Each runner of the use cases (once, runPaymentIntent) opens the span and
// ends it with its result; the database's and the channel's spans are its
// children.
func traced(ctx context.Context, in idempotency.Intent) (context.Context, func(idempotency.Result, error)) {
	ctx, span := tracing.Tracer().Start(ctx, in.Operation, trace.WithAttributes(
		attribute.String("orderservice.operation", in.Operation),
		attribute.String("orderservice.tenant", in.TenantID),
		attribute.String("idempotency.key", in.Key)))
	return ctx, func(res idempotency.Result, err error) {
		d := idempotency.DispositionOf(res, err)
		span.SetAttributes(attribute.String("idempotency.disposition", string(d)))
		if state := stateAfter(res, err); state != "" {
			span.SetAttributes(attribute.String("idempotency.record.state", string(state)))
		}
		if d == idempotency.DispositionFailed && err != nil || d == idempotency.DispositionUnavailable {
			span.RecordError(err)
			span.SetStatus(codes.Error, string(problem.CodeOf(err)))
		}
		span.End()
	}
}

// stateAfter is the state the intent's record is in when the attempt
// answers, where the answer tells it: a result is stored SUCCEEDED or
// FAILED_FINAL; a 409 means another attempt holds it PROCESSING.
func stateAfter(res idempotency.Result, err error) idempotency.State {
	switch {
	case err == nil && res.Outcome == idempotency.OutcomeFailed:
		return idempotency.FailedFinal
	case err == nil:
		return idempotency.Succeeded
	case problem.CodeOf(err) == problem.RequestInProgress:
		return idempotency.Processing
	}
	return ""
}

// mark notes on the use case's span what the idempotency layer just did
// with the record: "claimed", "replayed", "taken_over", "lost_race".
func mark(ctx context.Context, what string, attrs ...attribute.KeyValue) {
	trace.SpanFromContext(ctx).AddEvent("idempotency.record."+what, trace.WithAttributes(attrs...))
}

// tracedResume is the span of the sweeper's takeover of one unfinished
// intent: a trace of its own, since nobody is waiting for it.
func tracedResume(ctx context.Context, rec idempotency.Record) (context.Context, trace.Span) {
	return tracing.Tracer().Start(ctx, "sweep "+rec.Operation, trace.WithNewRoot(), trace.WithAttributes(
		attribute.String("orderservice.operation", rec.Operation),
		attribute.String("orderservice.tenant", rec.TenantID),
		attribute.String("idempotency.key", rec.IdempotencyKey),
		attribute.Int("idempotency.record.attempts", rec.Attempts)))
}
