DROP INDEX payments_pending;
DROP TABLE webhook_inbox;
ALTER TABLE idempotency_records
    DROP CONSTRAINT idempotency_records_outcome_check,
    ADD CONSTRAINT idempotency_records_outcome_check CHECK (outcome IN ('created', 'done', 'failed'));
