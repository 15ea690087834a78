-- An outbox event remembers the trace of the transaction that wrote it (a
-- W3C traceparent, NULL when that transaction was not traced), so its
-- publish, later and from any instance's relay, is linked to it.
ALTER TABLE order_outbox ADD COLUMN traceparent text;
