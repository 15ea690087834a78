-- Payments that finish later. The channel may take a charge on as
-- "pending" and tell its outcome afterwards, by a signed webhook or when
-- asked by the charge's key.
--
-- A pay whose charge is pending ends its intent with that answer
-- (202 Accepted, the order in PAYMENT_PENDING), replayed to its retries.
ALTER TABLE idempotency_records
    DROP CONSTRAINT idempotency_records_outcome_check,
    ADD CONSTRAINT idempotency_records_outcome_check CHECK (outcome IN ('created', 'done', 'accepted', 'failed'));

-- The webhook inbox: one row per webhook-id the channel delivered, written
-- in the transaction that acts on it. The channel delivers at least once,
-- so the primary key, not a cache, decides that a second delivery does
-- nothing; a row is kept for the channel's longest replay window plus the
-- margin (REPLAY_WINDOW_WEBHOOK), as a record is for its callers'.
CREATE TABLE webhook_inbox (
    webhook_id  text        PRIMARY KEY CHECK (length(webhook_id) BETWEEN 1 AND 255),
    event_type  text        NOT NULL,
    -- applied: it moved a payment (and its order); ignored: there was
    -- nothing to move (the outcome was known already, or the event is not
    -- one the service acts on).
    outcome     text        NOT NULL CHECK (outcome IN ('applied', 'ignored')),
    received_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX webhook_inbox_expires ON webhook_inbox (expires_at);

-- The sweeper asks the channel about payments still pending whose intent
-- has ended (no webhook came): few rows, so a partial index.
CREATE INDEX payments_pending ON payments (updated_at) WHERE status = 'pending';
