-- One row per money movement an intent asked the payment channel for: a
-- charge (order.pay) or a refund (order.cancel of a paid order). The row is
-- written in phase 1, before the channel is called, and carries the stable
-- downstream key: every retry, takeover and recovery of the intent sends the
-- same channel_key, so the channel can never charge twice.
CREATE TABLE payments (
    id              uuid        PRIMARY KEY,
    order_id        uuid        NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    tenant_id       text        NOT NULL,
    kind            text        NOT NULL CHECK (kind IN ('charge', 'refund')),
    status          text        NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed')),
    amount          bigint      NOT NULL CHECK (amount > 0),
    currency        text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    payment_method  text,
    channel_key     text        NOT NULL UNIQUE,
    channel_ref     text,
    refund_of       text,
    operation       text        NOT NULL,
    idempotency_key text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    -- One money movement per intent.
    UNIQUE (tenant_id, operation, idempotency_key),
    CHECK ((kind = 'refund') = (refund_of IS NOT NULL))
);

-- Defence in depth behind the state machine: at most one charge and one
-- refund per order that is pending or has succeeded.
CREATE UNIQUE INDEX payments_one_live_charge ON payments (order_id)
    WHERE kind = 'charge' AND status IN ('pending', 'succeeded');
CREATE UNIQUE INDEX payments_one_live_refund ON payments (order_id)
    WHERE kind = 'refund' AND status IN ('pending', 'succeeded');
-- Reading an order loads its payments, oldest first.
CREATE INDEX payments_order ON payments (order_id, created_at, id);
