-- The idempotency record: one row per (tenant, operation, Idempotency-Key).
-- The primary key is the last line of defence against racing duplicates: the
-- claim is an INSERT ... ON CONFLICT DO NOTHING, never "select, then insert".
CREATE TABLE idempotency_records (
    tenant_id        text        NOT NULL,
    operation        text        NOT NULL,
    idempotency_key  text        NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    fingerprint      text        NOT NULL CHECK (fingerprint ~ '^[0-9a-f]{64}$'),
    state            text        NOT NULL CHECK (state IN ('PROCESSING', 'SUCCEEDED', 'FAILED_RETRYABLE', 'FAILED_FINAL')),
    resource_id      text,
    response_status  integer,
    response_location text,
    response_content_type text,
    response_body    bytea,
    -- Fencing token: every takeover increments it, and every write of an
    -- outcome names the token it holds, so a superseded owner writes 0 rows.
    lease_token      bigint      NOT NULL DEFAULT 1,
    lease_expires_at timestamptz,
    attempts         integer     NOT NULL DEFAULT 1,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    expires_at       timestamptz,
    PRIMARY KEY (tenant_id, operation, idempotency_key),
    -- A definitive outcome always carries the response it will replay.
    CONSTRAINT idempotency_records_outcome_stored CHECK (
        state NOT IN ('SUCCEEDED', 'FAILED_FINAL')
        OR (response_status IS NOT NULL AND response_body IS NOT NULL AND completed_at IS NOT NULL)
    ),
    -- Work in flight or waiting for a retry always has a lease to expire.
    CONSTRAINT idempotency_records_lease_present CHECK (
        state NOT IN ('PROCESSING', 'FAILED_RETRYABLE') OR lease_expires_at IS NOT NULL
    )
);

-- GET /v1/idempotency-records?key=K looks a key up across operations.
CREATE INDEX idempotency_records_tenant_key ON idempotency_records (tenant_id, idempotency_key);
-- The sweeper looks for expired leases among unfinished records only.
CREATE INDEX idempotency_records_resumable ON idempotency_records (lease_expires_at)
    WHERE state IN ('PROCESSING', 'FAILED_RETRYABLE');
-- The cleanup job looks for expired records among finished ones only.
CREATE INDEX idempotency_records_expiry ON idempotency_records (expires_at)
    WHERE state IN ('SUCCEEDED', 'FAILED_FINAL');

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
