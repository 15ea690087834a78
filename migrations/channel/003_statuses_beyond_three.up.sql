-- Statuses beyond succeeded, declined and pending, so that the order
-- service can be tested against them: a charge that waits for the
-- customer (requires_action) until it settles, and refunds that are
-- pending until they settle, or fail.
ALTER TABLE charges
    DROP CONSTRAINT charges_status_check,
    ADD CONSTRAINT charges_status_check CHECK (status IN ('succeeded', 'declined', 'pending', 'requires_action')),
    DROP CONSTRAINT charges_pending_settles,
    ADD CONSTRAINT charges_pending_settles CHECK (status NOT IN ('pending', 'requires_action') OR settles_at IS NOT NULL);

DROP INDEX charges_pending;
CREATE INDEX charges_pending ON charges (settles_at) WHERE status IN ('pending', 'requires_action');

-- A pending refund holds its amount on the charge (amount_refunded) until
-- it settles; a failed one never held any.
ALTER TABLE refunds
    DROP CONSTRAINT refunds_status_check,
    ADD CONSTRAINT refunds_status_check CHECK (status IN ('succeeded', 'pending', 'failed')),
    ADD COLUMN settles_at timestamptz,
    ADD CONSTRAINT refunds_pending_settles CHECK (status <> 'pending' OR settles_at IS NOT NULL);

CREATE INDEX refunds_pending ON refunds (settles_at) WHERE status = 'pending';
