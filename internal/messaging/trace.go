package messaging

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/tracing"
)

// What a trace shows of the message door. Trace context crosses NATS in
// message headers (W3C traceparent), both ways: a command's delivery is
// processed in a consumer span that continues the publisher's trace, and
// its result carries the context on, so a client that published with a
// trace reads its result in the same trace. An outbox event is published
// in a producer span linked to the transaction that wrote it.

// traceDelivery starts the consumer span of one delivery of a command.
func traceDelivery(ctx context.Context, d delivery) (context.Context, trace.Span) {
	ctx = tracing.Extract(ctx, d.msg.Headers())
	return tracing.Tracer().Start(ctx, "process "+d.subject(), trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			semconv.MessagingSystemKey.String("nats"),
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingDestinationName(d.subject()),
			attribute.Int("messaging.nats.delivery_count", d.count),
			attribute.Int64("messaging.nats.stream_sequence", int64(d.seq)),
		))
}

// tracePublish starts the producer span of an outbox event's publish,
// linked to the transaction that wrote the event, and puts its context in
// the message's headers for the event's consumers.
func tracePublish(ctx context.Context, m *nats.Msg, e order.OutboxEvent) trace.Span {
	var links []trace.Link
	if e.Traceparent != nil {
		if sc := tracing.SpanContextOf(*e.Traceparent); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	ctx, span := tracing.Tracer().Start(ctx, "send "+m.Subject, trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(links...),
		trace.WithAttributes(
			semconv.MessagingSystemKey.String("nats"),
			semconv.MessagingOperationTypeSend,
			semconv.MessagingDestinationName(m.Subject),
			semconv.MessagingMessageID(e.EventID.String()),
		))
	tracing.Inject(ctx, m.Header)
	return span
}
