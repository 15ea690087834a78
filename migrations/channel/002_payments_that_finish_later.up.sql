-- Payments that finish later, and the webhooks that tell every outcome.

-- A charge taken on as pending settles at settles_at. The due time is in
-- the ledger, not in a timer, so a channel restarted before it still
-- settles the charge, and any of several channels on this database may.
ALTER TABLE charges
    DROP CONSTRAINT charges_status_check,
    ADD CONSTRAINT charges_status_check CHECK (status IN ('succeeded', 'declined', 'pending')),
    ADD COLUMN settles_at timestamptz,
    ADD CONSTRAINT charges_pending_settles CHECK (status <> 'pending' OR settles_at IS NOT NULL);

CREATE INDEX charges_pending ON charges (settles_at) WHERE status = 'pending';

-- The webhook outbox: one event per outcome of a charge or refund, written
-- in the transaction of that outcome, so that no outcome goes untold and
-- none is told that did not happen. The delivery loop sends each until the
-- receiver answers 2xx or the retry window ends; the id is the webhook-id,
-- the same on every attempt, and body the exact bytes every attempt signs.
CREATE TABLE webhook_events (
    id              text        PRIMARY KEY,
    seq             bigint      GENERATED ALWAYS AS IDENTITY,
    type            text        NOT NULL CHECK (type IN ('charge.succeeded', 'charge.declined', 'refund.succeeded', 'refund.failed')),
    -- The charge or refund the event tells of, and its idempotency key:
    -- one event of a type per key, so a charge settles into one event.
    object_id       text        NOT NULL,
    object_key      text        NOT NULL,
    body            text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    attempts        int         NOT NULL DEFAULT 0,
    -- The HTTP status of the last attempt (NULL: no answer), and why it failed.
    last_status     int,
    last_error      text,
    -- When the loop sends it next; NULL once delivered or given up.
    next_attempt_at timestamptz,
    delivered_at    timestamptz,
    given_up_at     timestamptz,
    UNIQUE (type, object_key)
);

CREATE INDEX webhook_events_due ON webhook_events (next_attempt_at) WHERE next_attempt_at IS NOT NULL;
