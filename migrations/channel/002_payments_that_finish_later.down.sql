-- Fails while a charge is pending, rather than settle or forget it.
DROP TABLE webhook_events;
DROP INDEX charges_pending;
ALTER TABLE charges
    DROP CONSTRAINT charges_pending_settles,
    DROP COLUMN settles_at,
    DROP CONSTRAINT charges_status_check,
    ADD CONSTRAINT charges_status_check CHECK (status IN ('succeeded', 'declined'));
