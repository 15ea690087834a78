-- The mock payment channel's own ledger, in its own database: charges,
-- refunds and the idempotency records they are, so that a restart forgets
-- nothing a real acquirer would remember.

-- A charge is its own idempotency record: the key is the primary key, so
-- the unique constraint, not a lookup, decides which request charges.
CREATE TABLE charges (
    idempotency_key text        PRIMARY KEY CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    id              text        NOT NULL UNIQUE,
    seq             bigint      GENERATED ALWAYS AS IDENTITY,
    status          text        NOT NULL CHECK (status IN ('succeeded', 'declined')),
    amount          bigint      NOT NULL CHECK (amount > 0),
    currency        text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    reference       text        NOT NULL CHECK (length(reference) <= 255),
    payment_method  text        NOT NULL,
    -- Refunded or reserved by a refund in flight; never more than amount.
    amount_refunded bigint      NOT NULL DEFAULT 0 CHECK (amount_refunded BETWEEN 0 AND amount),
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE refunds (
    idempotency_key text        PRIMARY KEY CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    id              text        NOT NULL UNIQUE,
    charge_id       text        NOT NULL REFERENCES charges (id),
    status          text        NOT NULL CHECK (status = 'succeeded'),
    amount          bigint      NOT NULL CHECK (amount > 0),
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX refunds_charge_id ON refunds (charge_id);

-- POSTs seen per key, for /admin/charges.
CREATE TABLE attempts (
    kind            text   NOT NULL CHECK (kind IN ('charge', 'refund')),
    idempotency_key text   NOT NULL,
    requests        bigint NOT NULL,
    PRIMARY KEY (kind, idempotency_key)
);

-- Keys that already had their pm_unavailable_once 503: once per key, for
-- good, even across a restart.
CREATE TABLE unavailable_given (
    kind            text NOT NULL CHECK (kind IN ('charge', 'refund')),
    idempotency_key text NOT NULL,
    PRIMARY KEY (kind, idempotency_key)
);

-- The counters that are not rows of the ledger (requests, lookups,
-- duplicates absorbed, faults given). Each is split over a few shards so
-- that concurrent requests do not queue on one row; a counter is the sum
-- of its shards.
CREATE TABLE counters (
    name  text   NOT NULL,
    shard int    NOT NULL,
    value bigint NOT NULL,
    PRIMARY KEY (name, shard)
);
