-- An order, its items and its history. The status column is the state
-- machine's state (internal/order/fsm.go holds the one table of transitions).
CREATE TABLE orders (
    id              uuid        PRIMARY KEY,
    tenant_id       text        NOT NULL,
    customer_id     text        NOT NULL CHECK (length(customer_id) BETWEEN 1 AND 100),
    status          text        NOT NULL CHECK (status IN (
                        'CREATED', 'PAYMENT_PENDING', 'PAID', 'PAYMENT_FAILED', 'REFUND_PENDING',
                        'SHIPPED', 'DELIVERED', 'CANCELLED')),
    currency        text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    total_amount    bigint      NOT NULL CHECK (total_amount >= 0),
    metadata        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    carrier         text,
    tracking_number text,
    version         bigint      NOT NULL DEFAULT 1,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Ids are UUIDv7, so id order is creation order: keyset pagination walks
-- (tenant_id, id) backwards, newest first, with or without a filter.
CREATE INDEX orders_tenant_id ON orders (tenant_id, id DESC);
CREATE INDEX orders_tenant_status ON orders (tenant_id, status, id DESC);
CREATE INDEX orders_tenant_customer ON orders (tenant_id, customer_id, id DESC);

CREATE TABLE order_items (
    order_id   uuid    NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    line_no    integer NOT NULL CHECK (line_no BETWEEN 1 AND 100),
    sku        text    NOT NULL CHECK (length(sku) BETWEEN 1 AND 64),
    quantity   integer NOT NULL CHECK (quantity BETWEEN 1 AND 1000),
    unit_price bigint  NOT NULL CHECK (unit_price >= 0),
    line_total bigint  NOT NULL CHECK (line_total = unit_price * quantity),
    PRIMARY KEY (order_id, line_no)
);

-- The order's history: every transition with the intent (key) that caused it.
CREATE TABLE order_events (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id        uuid        NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    event           text        NOT NULL,
    operation       text        NOT NULL,
    idempotency_key text        NOT NULL,
    from_status     text        NOT NULL,
    to_status       text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX order_events_order ON order_events (order_id, id);
