ALTER TABLE order_outbox DROP COLUMN traceparent;
