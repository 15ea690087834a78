-- The transactional outbox: every transition of an order writes one row
-- here in the transaction that makes it, and a relay publishes the row to
-- NATS (orders.events.<tenant>.<event>) and marks it published. A table of
-- its own rather than columns on order_events: the history is kept forever
-- and read per order, while outbox rows carry a whole order snapshot, are
-- polled by a hot partial index and are deleted after the retention.
CREATE TABLE order_outbox (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The event's stable id: Nats-Msg-Id, so JetStream drops a republished copy.
    event_id     uuid        NOT NULL UNIQUE,
    tenant_id    text        NOT NULL,
    order_id     uuid        NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    event        text        NOT NULL CHECK (event ~ '^[a-z_]+$'),
    -- The message body, byte for byte as it is published.
    payload      bytea       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
-- The relay takes the oldest unpublished events, and per order only the
-- first unpublished one, so it looks them up by order as well.
CREATE INDEX order_outbox_unpublished ON order_outbox (id) WHERE published_at IS NULL;
CREATE INDEX order_outbox_unpublished_order ON order_outbox (order_id, id) WHERE published_at IS NULL;
-- The cleanup deletes published rows older than the retention.
CREATE INDEX order_outbox_published ON order_outbox (published_at) WHERE published_at IS NOT NULL;
