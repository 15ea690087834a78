-- Fails while a charge requires action or a refund is pending or failed,
-- rather than settle or forget it.
DROP INDEX refunds_pending;
ALTER TABLE refunds
    DROP CONSTRAINT refunds_pending_settles,
    DROP COLUMN settles_at,
    DROP CONSTRAINT refunds_status_check,
    ADD CONSTRAINT refunds_status_check CHECK (status = 'succeeded');
DROP INDEX charges_pending;
CREATE INDEX charges_pending ON charges (settles_at) WHERE status = 'pending';
ALTER TABLE charges
    DROP CONSTRAINT charges_pending_settles,
    ADD CONSTRAINT charges_pending_settles CHECK (status <> 'pending' OR settles_at IS NOT NULL),
    DROP CONSTRAINT charges_status_check,
    ADD CONSTRAINT charges_status_check CHECK (status IN ('succeeded', 'declined', 'pending'));
